#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gradscope/core/error.h"
#include "gradscope/models/modernbert.h"
#include "gradscope/models/registry.h"
#include "gradscope/train/autocast.h"
#include "gradscope/train/session.h"
#include "models/model_test_util.h"

namespace gradscope {
namespace {

using testing::max_abs_diff;
using testing::module_param_count;
using testing::random_ids;
using testing::random_normal;

std::shared_ptr<ModernBertModel> make_bert(const nlohmann::json& arch, uint64_t seed = 1) {
  auto model = std::dynamic_pointer_cast<ModernBertModel>(make_modernbert(arch, seed));
  EXPECT_TRUE(model);
  return model;
}

TEST(ModernBertPreset, PaperCountsAsPublished) {
  const auto arch = modernbert_preset("paper");
  EXPECT_EQ(arch["vocab_size"], 50368);
  EXPECT_EQ(modernbert_encoder_params(arch), 149014272);
  EXPECT_EQ(modernbert_count_params(arch), 149655232);  // with the MLM head
}

TEST(ModernBertPreset, PaperKeepsItsPublishedVocabulary) {
  RunConfig c;
  c.model = "modernbert";
  c.preset = "paper";
  EXPECT_EQ(resolve_arch(c)["vocab_size"], 50368);  // holds GPT-2's 50257 ids, as published
  c.tokenizer = "bytes";
  EXPECT_EQ(resolve_arch(c)["vocab_size"], 320);  // another tokenizer: its size, padded
}

TEST(ModernBertPreset, CountMatchesModulesAtTinyAndSmall) {
  for (const char* preset : {"tiny", "small"}) {
    const auto arch = modernbert_preset(preset);
    auto model = make_bert(arch);
    EXPECT_EQ(module_param_count(*model), modernbert_count_params(arch)) << preset;
  }
}

TEST(ModernBert, GlobalEveryThirdLayerAndNoAttentionNormFirst) {
  auto arch = modernbert_preset("tiny");
  arch["num_hidden_layers"] = 7;
  auto model = make_bert(arch);
  const auto blocks = model->blocks();
  ASSERT_EQ(blocks.size(), 7u);
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto* block = dynamic_cast<ModernBertBlock*>(blocks[i].get());
    ASSERT_TRUE(block);
    EXPECT_EQ(block->is_global(), i % 3 == 0) << i;
    EXPECT_EQ(static_cast<bool>(block->attn_norm), i > 0) << i;
  }
  for (const auto& p : model->named_parameters()) {
    EXPECT_EQ(p.key().find("bias") == std::string::npos || p.key() == "decoder_bias", true)
        << p.key() << ": ModernBERT has no biases but the decoder's";
  }
}

TEST(ModernBert, SlidingWindowMaskAtThePublishedWidth) {
  // local_attention 128: token i sees exactly the tokens within 64 on each side.
  const int64_t t = 300;
  auto mask = sliding_window_mask(t, 128 / 2);
  ASSERT_EQ(mask.sizes(), (std::vector<int64_t>{t, t}));
  auto accessor = mask.accessor<bool, 2>();
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < t; ++j)
      ASSERT_EQ(accessor[i][j], std::abs(i - j) <= 64) << i << "," << j;
}

// Which outputs of one block move when input position j changes.
std::vector<bool> influenced(ModernBertModel& model, int64_t layer, int64_t t, int64_t j) {
  auto block = model.blocks()[layer];
  const BlockContext ctx = model.context(t, torch::kCPU, {});
  auto x = random_normal({1, t, model.config().hidden_size}, 3);
  auto changed = x.clone();
  // A random change: a constant one would vanish in the LayerNorm's mean subtraction.
  changed.index_put_({0, j},
                     changed.index({0, j}) + random_normal({model.config().hidden_size}, 4));
  auto diff = (block->forward(x, ctx) - block->forward(changed, ctx)).abs().amax({0, 2});  // (T)
  std::vector<bool> out;
  // Outside the window the difference is exactly zero (masked scores are -inf).
  for (int64_t i = 0; i < t; ++i) out.push_back(diff[i].item<double>() > 1e-6);
  return out;
}

TEST(ModernBert, LocalLayersSeeOnlyTheWindowGlobalLayersSeeAll) {
  auto model = make_bert(modernbert_preset("tiny"));  // window 16: 8 on each side
  model->eval();
  const int64_t t = 40, j = 20;
  const auto local = influenced(*model, 1, t, j);
  const auto global = influenced(*model, 0, t, j);
  for (int64_t i = 0; i < t; ++i) {
    EXPECT_EQ(local[i], std::abs(i - j) <= 8) << "local layer, query " << i;
    EXPECT_TRUE(global[i]) << "global layer, query " << i;
  }
}

TEST(ModernBert, PaddingKeysAreInvisible) {
  auto model = make_bert(modernbert_preset("tiny"));
  model->eval();
  auto ids = random_ids(1, 12, 256, 4);
  auto real = torch::ones({1, 12}, torch::kBool);
  real.index_put_({0, torch::indexing::Slice(9, 12)}, false);
  auto a = model->encode(ids, real);
  auto changed = ids.clone();
  changed.index_put_({0, 10}, (ids.index({0, 10}) + 1).remainder(256));
  auto b = model->encode(changed, real);
  EXPECT_EQ(max_abs_diff(a.narrow(1, 0, 9), b.narrow(1, 0, 9)), 0.0);
  // Without the padding mask the same change reaches the first positions.
  EXPECT_GT(
      max_abs_diff(model->encode(ids).narrow(1, 0, 9), model->encode(changed).narrow(1, 0, 9)),
      0.0);
}

TEST(ModernBert, LossOnlyOverMaskedTargets) {
  auto model = make_bert(modernbert_preset("tiny"));
  model->eval();
  Batch batch;
  batch.input_ids = random_ids(2, 16, 256, 5);
  batch.targets = torch::full({2, 16}, kIgnoreIndex, torch::kLong);
  batch.targets.index_put_({0, 3}, 65);
  batch.targets.index_put_({1, 7}, 66);
  batch.targets.index_put_({1, 8}, 67);
  const LossOutput out = model->loss(batch);
  EXPECT_EQ(out.target_count, 3);
  auto hidden = model->encode(batch.input_ids);
  auto picked = torch::stack({hidden.index({0, 3}), hidden.index({1, 7}), hidden.index({1, 8})});
  auto expected = torch::nn::functional::cross_entropy(
      model->mlm_logits(picked), torch::tensor({65, 66, 67}, torch::kLong),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  EXPECT_NEAR(out.loss_sum.item<double>(), expected.item<double>(), 1e-4);
  // A fresh model's loss is near log(V): the decoder is tied to small random embeddings.
  EXPECT_NEAR(out.loss_sum.item<double>() / 3, std::log(320.0), 0.5);
}

// Two sequences of 24 tokens with about a third of the positions as targets.
Batch masked_batch() {
  Batch batch;
  batch.input_ids = random_ids(2, 24, 256, 6);
  batch.targets = torch::where(random_ids(2, 24, 3, 7).eq(0), random_ids(2, 24, 256, 8),
                               torch::full({2, 24}, kIgnoreIndex, torch::kLong));
  return batch;
}

TEST(ModernBert, GradientsReachEveryParameter) {
  auto model = make_bert(modernbert_preset("tiny"));
  const Batch batch = masked_batch();
  model->loss(batch).loss_sum.backward();
  for (const auto& p : model->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_GT(p.value().grad().abs().sum().item<double>(), 0.0) << p.key();
  }
}

// Under bfloat16 autocast the MLM head's norm gets the bfloat16 output of its dense layer;
// the loss must still be computed, and reach every parameter.
TEST(ModernBert, TrainsUnderBf16Autocast) {
  auto model = make_bert(modernbert_preset("tiny"));
  const Batch batch = masked_batch();
  LossOutput out;
  {
    AutocastScope autocast(torch::Device(torch::kCPU), /*enabled=*/true);
    out = model->loss(batch);
    out.loss_sum.backward();
  }
  EXPECT_TRUE(std::isfinite(out.loss_sum.item<double>()));
  for (const auto& p : model->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_EQ(p.value().grad().scalar_type(), torch::kFloat) << p.key();
  }
}

}  // namespace
}  // namespace gradscope
