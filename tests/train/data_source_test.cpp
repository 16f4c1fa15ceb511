// The data sources of the masked-LM, image-classification and vision-language models.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "gradscope/core/error.h"
#include "gradscope/data/tokenizer.h"
#include "gradscope/models/registry.h"
#include "gradscope/train/data_source.h"
#include "gradscope/train/session.h"
#include "test_util.h"

namespace gradscope {
namespace {

struct Source {
  nlohmann::json arch;
  std::unique_ptr<DataSource> data;
};

Source source_for(RunConfig c) {
  Source s;
  s.arch = resolve_arch(c);
  s.data = make_data_source(model_registry().get(c.model), s.arch, c);
  return s;
}

RunConfig bert_config() {
  RunConfig c;
  c.model = "modernbert";
  c.dataset = testing::fixture("text/sotu-excerpt.txt");
  return c;
}

TEST(MaskedLmSource, ModernBertMaskingRates) {
  Source s = source_for(bert_config());
  // The unmasked stream of the same windows: a causal-LM source's inputs.
  RunConfig plain = bert_config();
  auto causal = make_data_source(model_registry().get("llama"), s.arch, plain);
  const Batch b = s.data->train_batch(0, 64);
  const Batch original = causal->train_batch(0, 64);
  ASSERT_EQ(b.input_ids.sizes(), (std::vector<int64_t>{64, 64}));
  auto selected = b.targets.ne(kIgnoreIndex);
  const double n = static_cast<double>(selected.numel());
  const double k = selected.sum().item<double>();
  EXPECT_EQ(b.targets_count, static_cast<int64_t>(k));
  EXPECT_NEAR(k / n, 0.3, 0.02);  // 4096 positions: 3 standard deviations is 0.021
  // Targets are the original tokens; unselected positions are untouched.
  EXPECT_TRUE(
      torch::equal(b.targets.masked_select(selected), original.input_ids.masked_select(selected)));
  EXPECT_TRUE(torch::equal(b.input_ids.masked_select(selected.logical_not()),
                           original.input_ids.masked_select(selected.logical_not())));
  // Of the selected: 80% [MASK], 10% a random token, 10% kept (a random draw may also equal
  // the original, rarely with 260 ids).
  auto inputs = b.input_ids.masked_select(selected);
  auto targets = b.targets.masked_select(selected);
  const double masked = inputs.eq(kBytesMaskId).sum().item<double>() / k;
  const double kept = inputs.eq(targets).sum().item<double>() / k;
  EXPECT_NEAR(masked, 0.8, 0.035);
  EXPECT_NEAR(kept, 0.1, 0.03);
  EXPECT_NEAR(1 - masked - kept, 0.1, 0.03);
}

TEST(MaskedLmSource, MasksDependOnTheSampleAloneAndValidationIsFixed) {
  Source s = source_for(bert_config());
  const Batch whole = s.data->train_batch(10, 8);
  const Batch tail = s.data->train_batch(14, 4);
  EXPECT_TRUE(torch::equal(whole.input_ids.narrow(0, 4, 4), tail.input_ids));
  EXPECT_TRUE(torch::equal(whole.targets.narrow(0, 4, 4), tail.targets));
  EXPECT_TRUE(torch::equal(s.data->val_batch(0, 4).targets, s.data->val_batch(0, 4).targets));
  RunConfig other = bert_config();
  other.seed = 7;
  Source t = source_for(other);
  EXPECT_FALSE(torch::equal(t.data->val_batch(0, 4).targets, s.data->val_batch(0, 4).targets));
}

TEST(MaskedLmSource, Gpt2MasksWithTheFirstSpareId) {
  RunConfig c = bert_config();
  c.preset = "small";
  c.seq_len = 32;  // the excerpt holds 88 validation tokens
  if (!testing::have_data("tokenizers/gpt2"))
    GTEST_SKIP() << "run scripts/fetch-data.sh tokenizers";
  Source s = source_for(c);
  EXPECT_EQ(s.data->describe()["mask_id"], 50257);
  EXPECT_GT(s.data->train_batch(0, 4).input_ids.eq(50257).sum().item<int64_t>(), 0);
}

// Documents joined by the eot id: a corpus with a special token every ~100 positions.
std::string write_documents(const std::string& dir, int count) {
  for (int d = 0; d < count; ++d) {
    std::ofstream out(std::filesystem::path(dir) / fmt::format("doc{:03d}.txt", d));
    out << fmt::format(
        "Document {} says that the quick brown fox jumps over the lazy dog, "
        "and then it rests for {} minutes.",
        d, 3 * d + 1);
  }
  return dir;
}

// Special tokens (the eot id between documents) are structure: never a target, never masked,
// never drawn as a replacement. `first_special` is the tokenizer's first special id.
void expect_no_special_selected(RunConfig c, int64_t first_special, int documents) {
  testing::TempDir docs("gradscope-mlm");
  c.dataset = write_documents(docs.path(), documents);
  Source s = source_for(c);
  auto causal = make_data_source(model_registry().get("llama"), s.arch, c);
  const int64_t mask_id = s.data->describe()["mask_id"].get<int64_t>();
  const int64_t windows = s.data->describe()["train_windows"].get<int64_t>();
  const int64_t val = s.data->val_samples();
  const std::vector<std::pair<Batch, Batch>> batches = {
      {s.data->train_batch(0, windows), causal->train_batch(0, windows)},
      {s.data->val_batch(0, val), causal->val_batch(0, val)}};
  int64_t specials = 0;
  for (const auto& [b, original] : batches) {
    const auto special = original.input_ids.ge(first_special);
    specials += special.sum().item<int64_t>();
    EXPECT_EQ(b.targets.masked_select(special).ne(kIgnoreIndex).sum().item<int64_t>(), 0)
        << "a special token is a prediction target";
    EXPECT_TRUE(
        torch::equal(b.input_ids.masked_select(special), original.input_ids.masked_select(special)))
        << "a special token was masked or replaced";
    const auto targets = b.targets.masked_select(b.targets.ne(kIgnoreIndex));
    EXPECT_EQ(targets.ge(first_special).sum().item<int64_t>(), 0);
    // What replaced a token is the mask id or an ordinary token.
    const auto changed = b.input_ids.masked_select(b.input_ids.ne(original.input_ids));
    EXPECT_EQ(changed.ne(mask_id).logical_and(changed.ge(first_special)).sum().item<int64_t>(), 0);
    EXPECT_GT(targets.numel(), 0);
  }
  EXPECT_GE(specials, documents * 4 / 5);  // a boundary between documents, most of them read
}

TEST(MaskedLmSource, NeverSelectsSpecialTokensBytes) {
  expect_no_special_selected(bert_config(), kBytesBosId, 60);
}

TEST(MaskedLmSource, NeverSelectsSpecialTokensGpt2) {
  if (!testing::have_data("tokenizers/gpt2"))
    GTEST_SKIP() << "run scripts/fetch-data.sh tokenizers";
  RunConfig c = bert_config();
  c.preset = "small";
  c.seq_len = 32;
  // <|endoftext|>, GPT-2's only special token; ~23 tokens a document, 2% of them held out.
  expect_no_special_selected(c, 50256, 200);
}

TEST(ImageClassificationSource, FashionMnistBatches) {
  RunConfig c;
  c.model = "vit";
  Source s = source_for(c);  // Debian's Fashion-MNIST when nothing is fetched
  const Batch b = s.data->train_batch(0, 256);
  EXPECT_EQ(b.images.sizes(), (std::vector<int64_t>{256, 3, 28, 28}));
  EXPECT_EQ(b.labels.sizes(), (std::vector<int64_t>{256}));
  EXPECT_EQ(b.tokens, 256 * 17);
  EXPECT_EQ(b.targets_count, 256);
  // Normalized with the training split's statistics: near zero mean, unit deviation.
  EXPECT_NEAR(b.images.mean().item<double>(), 0.0, 0.1);
  EXPECT_NEAR(b.images.std().item<double>(), 1.0, 0.1);
  // Three identical channels (grey replicated).
  EXPECT_TRUE(torch::equal(b.images.select(1, 0), b.images.select(1, 2)));
  // Every class appears in a shuffled batch of 256.
  EXPECT_EQ(std::get<0>(at::_unique(b.labels)).numel(), 10);
  const auto d = s.data->describe();
  EXPECT_EQ(d["train_images"], 60000);
  EXPECT_EQ(d["val_images"], 10000);
  EXPECT_NEAR(d["normalization"]["mean"][0].get<double>(), 0.2860, 1e-4);
  EXPECT_EQ(s.data->val_samples(), 10000);
  // Epochs visit every image once: the first 60000 samples are a permutation.
  EXPECT_FALSE(
      torch::equal(s.data->train_batch(0, 4).labels, s.data->train_batch(60000, 4).labels));
}

TEST(ImageClassificationSource, ResizesToThePresetImageSize) {
  RunConfig c;
  c.model = "vit";
  c.preset = "small";  // 32 px
  Source s = source_for(c);
  EXPECT_EQ(s.data->val_batch(0, 2).images.sizes(), (std::vector<int64_t>{2, 3, 32, 32}));
}

TEST(VisionLanguageSource, TemplatedCaptionsShiftedTargets) {
  RunConfig c;
  c.model = "nanovlm";  // tiny: Fashion-MNIST captions, bytes tokenizer, 32 caption positions
  Source s = source_for(c);
  const Batch b = s.data->val_batch(0, 4);
  EXPECT_EQ(b.images.sizes(), (std::vector<int64_t>{4, 3, 32, 32}));
  EXPECT_EQ(b.input_ids.sizes(), (std::vector<int64_t>{4, 32}));
  EXPECT_EQ(b.tokens, 4 * (4 + 32));
  // The first test image is an ankle boot: [eot] "a photo of an ankle boot" [eot].
  const std::string caption = "a photo of an ankle boot";
  const int64_t n = static_cast<int64_t>(caption.size());
  auto row = b.input_ids[0];
  EXPECT_EQ(row[0].item<int64_t>(), kBytesEosId);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(row[i + 1].item<int64_t>(), caption[i]) << i;
  EXPECT_EQ(row[n + 1].item<int64_t>(), kBytesEosId);
  auto targets = b.targets[0];
  for (int64_t i = 0; i <= n; ++i)
    EXPECT_EQ(targets[i].item<int64_t>(), row[i + 1].item<int64_t>());
  for (int64_t i = n + 1; i < 32; ++i) EXPECT_EQ(targets[i].item<int64_t>(), kIgnoreIndex) << i;
  ASSERT_TRUE(b.text_mask.defined());
  EXPECT_EQ(b.text_mask[0].sum().item<int64_t>(), n + 2);
  EXPECT_EQ(b.targets_count, b.targets.ne(kIgnoreIndex).sum().item<int64_t>());
}

TEST(VisionLanguageSource, EmojiOfTheWrongSizeNamesTheFile) {
  RunConfig c;
  c.model = "nanovlm";
  c.dataset = testing::fixture("images/emoji");  // 4x4 test images; the emoji set is 64x64
  try {
    source_for(c);
    FAIL() << "expected a usage error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(".png"), std::string::npos) << e.what();
  }
}

// The base emoji of each entry of the emoji-variants fixture, by the entry's caption (what
// precedes a skin tone's ", "): variants by tone, gender, direction and "obsoletes" share one.
std::string fixture_base(const std::string& caption) {
  const std::string name = caption.substr(0, caption.find(','));
  static const std::map<std::string, std::string> bases{
      {"runner", "running"},          {"man running", "running"},
      {"woman running", "running"},   {"person running facing right", "running"},
      {"man technologist", "techie"}, {"woman technologist", "techie"},
      {"technologist", "techie"},     {"family: man", "family"}};
  const auto it = bases.find(name);
  return it == bases.end() ? name : it->second;
}

// The base emoji of every caption in a batch (bytes tokenizer: [eot] caption [eot] ...).
std::multiset<std::string> batch_bases(const Batch& b) {
  std::multiset<std::string> out;
  const auto ids = b.input_ids.contiguous();
  for (int64_t i = 0; i < ids.size(0); ++i) {
    std::string caption;
    for (int64_t j = 1; j < ids.size(1) && ids[i][j].item<int64_t>() < 256; ++j)
      caption += static_cast<char>(ids[i][j].item<int64_t>());
    out.insert(fixture_base(caption));
  }
  return out;
}

struct Sides {
  std::multiset<std::string> train, held_out;
};

Sides emoji_sides(DataSplit split) {
  RunConfig c;
  c.model = "nanovlm";
  c.dataset = testing::fixture("images/emoji-variants");
  const nlohmann::json arch = resolve_arch(c);
  auto data = make_data_source(model_registry().get(c.model), arch, c, nullptr, split);
  const int64_t train = data->describe()["train_images"].get<int64_t>();
  return {batch_bases(data->train_batch(0, train)),
          batch_bases(data->val_batch(0, data->val_samples()))};
}

std::vector<std::string> common(const std::multiset<std::string>& a,
                                const std::multiset<std::string>& b) {
  std::vector<std::string> out;
  for (const auto& x : std::set<std::string>(a.begin(), a.end()))
    if (b.count(x)) out.push_back(x);
  return out;
}

// Skin tones, genders and directions of one emoji are near-copies: validating on one that
// was trained on under another tone measures memory, not generalization.
TEST(VisionLanguageSource, NoBaseEmojiOnBothSidesOfTheSplit) {
  const Sides run = emoji_sides(DataSplit::kRun);
  EXPECT_EQ(run.train.size() + run.held_out.size(), 27u);
  EXPECT_FALSE(run.held_out.empty());
  EXPECT_EQ(common(run.train, run.held_out), std::vector<std::string>{})
      << "base emoji with variants in training and in validation";
}

// --lr auto's trials train and evaluate within the training side, keeping bases whole too.
TEST(VisionLanguageSource, SearchSplitIsCarvedFromTheTrainingSide) {
  const Sides run = emoji_sides(DataSplit::kRun);
  const Sides search = emoji_sides(DataSplit::kLrSearch);
  EXPECT_EQ(search.train.size() + search.held_out.size(), run.train.size());
  EXPECT_FALSE(search.held_out.empty());
  EXPECT_EQ(common(search.train, search.held_out), std::vector<std::string>{});
  EXPECT_EQ(common(search.held_out, run.held_out), std::vector<std::string>{});
  EXPECT_EQ(common(search.train, run.held_out), std::vector<std::string>{});
}

TEST(VisionLanguageSource, RealEmojiCaptions) {
  if (!testing::have_data("emoji/emoji.json")) GTEST_SKIP() << "run scripts/fetch-data.sh emoji";
  RunConfig c;
  c.model = "nanovlm";
  c.dataset = "emoji";
  Source s = source_for(c);
  const auto d = s.data->describe();
  EXPECT_EQ(d["train_images"].get<int64_t>() + d["val_images"].get<int64_t>(), 3786);
  // Every tenth of the 1703 base emoji groups, ordered by size: 385 images of 171 bases.
  EXPECT_EQ(d["val_images"], 385);
  EXPECT_EQ(d["val_base_emoji"], 171);
  EXPECT_EQ(d["train_base_emoji"], 1703 - 171);
  EXPECT_EQ(s.data->train_batch(0, 2).images.sizes(), (std::vector<int64_t>{2, 3, 32, 32}));
}

}  // namespace
}  // namespace gradscope

namespace gradscope {
namespace {

// Every source counts a batch's targets on the CPU, and counts what the model's loss takes:
// the strategy normalizes by that count without asking the device, so it must be exact.
TEST(DataSourceTargets, EveryKindCountsItsTargetsOnTheCpu) {
  std::vector<RunConfig> configs;
  RunConfig llama = testing::tiny_llama_config();
  configs.push_back(llama);
  configs.push_back(bert_config());
  for (const char* model : {"vit", "nanovlm", "quadratic"}) {
    RunConfig c;
    c.model = model;
    configs.push_back(c);
  }
  for (const RunConfig& c : configs) {
    Source s = source_for(c);
    for (const Batch& b : {s.data->train_batch(3, 5), s.data->val_batch(0, 5)}) {
      int64_t counted = b.targets_count;
      if (b.targets.defined())
        counted = b.targets.ne(kIgnoreIndex).sum().item<int64_t>();
      else if (b.labels.defined())
        counted = b.labels.ne(kIgnoreIndex).sum().item<int64_t>();
      EXPECT_GT(b.targets_count, 0) << c.model;
      EXPECT_EQ(b.targets_count, counted) << c.model;
      // The model takes its loss over exactly those targets.
      auto model = model_registry().get(c.model).build(s.arch, 0);
      torch::NoGradGuard no_grad;
      EXPECT_EQ(model->loss(b).target_count, counted) << c.model;
    }
  }
}

}  // namespace
}  // namespace gradscope
