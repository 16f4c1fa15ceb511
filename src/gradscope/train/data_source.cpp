#include "gradscope/train/data_source.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/rng.h"
#include "gradscope/data/images.h"
#include "gradscope/data/text.h"
#include "gradscope/data/tokenizer.h"
#include "gradscope/measure/memory.h"
#include "gradscope/models/registry.h"

namespace gradscope {
namespace {

// Counter-based streams of the per-sample randomness (core/rng.h).
constexpr uint64_t kMlmTrainStream = 0x6d6c6d747261696eULL;  // "mlmtrain"
constexpr uint64_t kMlmValStream = 0x6d6c6d76616c6964ULL;    // "mlmvalid"

// Validation items [first, first + count) in order, wrapping around. (count)
torch::Tensor wrapped_items(int64_t first, int64_t count, int64_t n) {
  return (torch::arange(count, torch::kInt64) + first).remainder(n);
}

// Every how many groups (images, base emoji) a held-out split takes one: validation of the
// emoji set, and the search split of every image set.
constexpr int64_t kHeldOutEvery = 10;

// The images of `all` whose held flag is `which`, in order.
ImageSet select_images(const ImageSet& all, const std::vector<bool>& held, bool which) {
  std::vector<int64_t> picked;
  for (int64_t i = 0; i < all.size(); ++i)
    if (held[static_cast<size_t>(i)] == which) picked.push_back(i);
  const auto items = torch::tensor(picked, torch::kInt64);
  ImageSet out;
  out.pixels = all.pixels.index_select(0, items);
  if (all.labels.defined()) out.labels = all.labels.index_select(0, items);
  out.class_names = all.class_names;
  for (int64_t i : picked) {
    if (!all.captions.empty()) out.captions.push_back(all.captions[i]);
    if (!all.groups.empty()) out.groups.push_back(all.groups[i]);
  }
  return out;
}

// A run's training side, or a search's: the search keeps the rest of the training side for
// training and evaluates on every tenth group of it. (The run's `held_out` is untouched.)
void carve_search_split(ImageSet& train, ImageSet& held_out) {
  const auto held = held_out_by_group(train.groups, train.size(), kHeldOutEvery);
  held_out = select_images(train, held, true);
  train = select_images(train, held, false);
}

// What a run's record says of the split --lr auto searched on.
nlohmann::json image_search_description(const ImageSet& train) {
  const auto held = held_out_by_group(train.groups, train.size(), kHeldOutEvery);
  const auto searched = std::count(held.begin(), held.end(), true);
  const std::string rule =
      train.groups.empty()
          ? fmt::format("every {}th training image, from the first", kHeldOutEvery)
          : fmt::format(
                "every {}th base emoji of the training side, ordered by their number "
                "of images, then by file name",
                kHeldOutEvery);
  return {{"from", "the training side"},
          {"rule", rule},
          {"search_images", searched},
          {"trial_train_images", train.size() - searched}};
}

// Class names of an IDX data set: MNIST's digits for "mnist", Fashion-MNIST's otherwise.
const std::vector<std::string>& idx_classes(const std::string& dataset) {
  return dataset == "mnist" ? mnist_classes() : fashion_mnist_classes();
}

// What a run's record says of the split --lr auto searched on: as many tokens as the
// validation split, just before it.
nlohmann::json text_search_description(const TextCorpus& corpus) {
  const int64_t tokens = corpus.val_tokens();
  return {{"from", "the training side"},
          {"rule", "the tokens just before the validation tokens, as many as they are"},
          {"search_tokens", tokens},
          {"trial_train_tokens", corpus.train_tokens() - tokens}};
}

// The unigram entropy of the training split; null for a corpus loaded for evaluation alone,
// which has none.
nlohmann::json training_unigram_entropy(const TextCorpus& corpus) {
  if (corpus.split_index() == 0) return nullptr;
  return unigram_entropy_nats(corpus.tokens(), 0, corpus.split_index());
}

std::unique_ptr<Tokenizer> tokenizer_for(const nlohmann::json& arch) {
  auto tokenizer = make_tokenizer(arch.at("tokenizer").get<std::string>(), data_dir());
  const int64_t vocab = arch.at("vocab_size").get<int64_t>();
  check_usage(tokenizer->vocab_size() <= vocab,
              fmt::format("tokenizer '{}' has {} ids but the model's vocabulary is {}",
                          tokenizer->name(), tokenizer->vocab_size(), vocab),
              "choose a tokenizer that fits the preset, or leave --tokenizer unset");
  return tokenizer;
}

// Next-token prediction over windows of a tokenized corpus.
class CausalLmSource : public DataSource {
 public:
  CausalLmSource(const nlohmann::json& arch, const RunConfig& config, DataSplit split)
      : dataset_(arch.at("dataset").get<std::string>()),
        tokenizer_(tokenizer_for(arch)),
        corpus_(dataset_, *tokenizer_, data_dir(), arch.at("seq_len").get<int64_t>(), config.seed,
                split),
        lr_auto_(config.lr_auto && split == DataSplit::kRun) {}

  Batch train_batch(int64_t first, int64_t count) const override {
    return to_batch(corpus_.train_batch(first, count));
  }
  Batch val_batch(int64_t first, int64_t count) const override {
    return to_batch(corpus_.val_batch(first, count));
  }
  int64_t val_samples() const override { return corpus_.val_windows(); }

  nlohmann::json describe() const override {
    nlohmann::json out = {{"dataset", dataset_},
                          {"tokenizer", tokenizer_->name()},
                          {"train_tokens", corpus_.train_tokens()},
                          {"val_tokens", corpus_.val_tokens()},
                          {"train_windows", corpus_.train_windows()},
                          {"unigram_entropy_nats", training_unigram_entropy(corpus_)}};
    if (lr_auto_) out["lr_search_split"] = text_search_description(corpus_);
    return out;
  }

 private:
  static Batch to_batch(TextBatch text) {
    Batch batch;
    batch.samples = text.input_ids.size(0);
    batch.tokens = text.input_ids.numel();
    batch.targets_count = text.targets.numel();
    batch.input_ids = std::move(text.input_ids);
    batch.targets = std::move(text.targets);
    return batch;
  }

  std::string dataset_;
  std::unique_ptr<Tokenizer> tokenizer_;
  TextCorpus corpus_;
  bool lr_auto_;
};

// Masked language modelling over windows of a tokenized corpus, with ModernBERT's recipe:
// each position is selected with probability mlm_probability (0.3); a selected position is
// replaced by the mask id (80%), by a uniformly drawn token (10%) or kept (10%), and only
// selected positions have targets (their original token). Special tokens (the eot id between
// documents, and whatever else the tokenizer calls special) are never selected: they are
// structure, not text to predict, and a masked boundary would hide where documents meet. The
// drawn replacement is never a special token either. The draws come from a hash of
// (seed, stream, sample index, position), so a sample is masked the same way whatever the
// batch split; validation windows use their own stream and are masked the same at every
// evaluation.
class MaskedLmSource : public DataSource {
 public:
  MaskedLmSource(const nlohmann::json& arch, const RunConfig& config, DataSplit split)
      : dataset_(arch.at("dataset").get<std::string>()),
        tokenizer_(tokenizer_for(arch)),
        corpus_(dataset_, *tokenizer_, data_dir(), arch.at("seq_len").get<int64_t>(), config.seed,
                split),
        lr_auto_(config.lr_auto && split == DataSplit::kRun),
        seed_(config.seed),
        probability_(arch.value("mlm_probability", 0.3)),
        mask_id_(mask_token_id(*tokenizer_, arch.at("vocab_size").get<int64_t>())) {
    for (int64_t id = 0; id < tokenizer_->vocab_size(); ++id)
      if (!tokenizer_->is_special(static_cast<int32_t>(id)))
        replacements_.push_back(static_cast<int32_t>(id));
    check_usage(!replacements_.empty(),
                fmt::format("tokenizer '{}' has only special tokens", tokenizer_->name()));
  }

  Batch train_batch(int64_t first, int64_t count) const override {
    return masked(corpus_.train_batch(first, count), first, kMlmTrainStream);
  }
  Batch val_batch(int64_t first, int64_t count) const override {
    return masked(corpus_.val_batch(first, count), first, kMlmValStream);
  }
  int64_t val_samples() const override { return corpus_.val_windows(); }

  nlohmann::json describe() const override {
    nlohmann::json out = {
        {"dataset", dataset_},
        {"tokenizer", tokenizer_->name()},
        {"objective", "masked language modelling: loss over the selected positions only"},
        {"mlm_probability", probability_},
        {"mask_id", mask_id_},
        {"train_tokens", corpus_.train_tokens()},
        {"val_tokens", corpus_.val_tokens()},
        {"train_windows", corpus_.train_windows()},
        {"unigram_entropy_nats", training_unigram_entropy(corpus_)}};
    if (lr_auto_) out["lr_search_split"] = text_search_description(corpus_);
    return out;
  }

 private:
  // The id a masked position reads: the bytes tokenizer's MASK, else the first id past the
  // tokenizer's (a padded vocabulary has room; GPT-2's 50257 in 50304 or 50368).
  static int64_t mask_token_id(const Tokenizer& tokenizer, int64_t vocab) {
    if (tokenizer.name() == "bytes") return kBytesMaskId;
    check_usage(tokenizer.vocab_size() < vocab,
                fmt::format("masked language modelling needs a spare id for [MASK], but "
                            "tokenizer '{}' fills the whole vocabulary of {}",
                            tokenizer.name(), vocab),
                "use the bytes or gpt2 tokenizer");
    return tokenizer.vocab_size();
  }

  Batch masked(TextBatch text, int64_t first, uint64_t stream) const {
    auto ids = text.input_ids.contiguous();              // (B, T)
    auto targets = torch::full_like(ids, kIgnoreIndex);  // (B, T)
    const int64_t b = ids.size(0), t = ids.size(1);
    const auto choices = static_cast<double>(replacements_.size());
    int64_t* x = ids.data_ptr<int64_t>();
    int64_t* y = targets.data_ptr<int64_t>();
    int64_t selected = 0;
    for (int64_t i = 0; i < b; ++i) {
      const uint64_t sample = hash3(seed_, stream, static_cast<uint64_t>(first + i));
      for (int64_t j = 0; j < t; ++j) {
        int64_t& token = x[i * t + j];
        if (token == mask_id_ || tokenizer_->is_special(static_cast<int32_t>(token))) continue;
        const uint64_t h = mix64(sample ^ mix64(static_cast<uint64_t>(j)));
        if (unit_double(h) >= probability_) continue;
        y[i * t + j] = token;
        ++selected;
        const double u = unit_double(mix64(h ^ 0x5bd1e995ULL));
        if (u < 0.8) {
          token = mask_id_;
        } else if (u < 0.9) {
          const auto k = static_cast<size_t>(unit_double(mix64(h + 1)) * choices);
          token = replacements_[std::min(k, replacements_.size() - 1)];
        }
      }
    }
    Batch batch;
    batch.samples = b;
    batch.tokens = b * t;
    batch.targets_count = selected;
    batch.input_ids = ids;
    batch.targets = targets;
    return batch;
  }

  std::string dataset_;
  std::unique_ptr<Tokenizer> tokenizer_;
  TextCorpus corpus_;
  bool lr_auto_;
  uint64_t seed_;
  double probability_;
  int64_t mask_id_;
  std::vector<int32_t> replacements_;  // the ids a random replacement draws from: no specials
};

// Images with class labels (Fashion-MNIST, MNIST): the standard training split shuffled per
// epoch, the standard test split for validation (--lr auto's search: every tenth training
// image instead, and training on the others). Images are normalized per channel with the
// training images' own mean and standard deviation, replicated to 3 channels and resized to
// the model's image size.
class ImageClassificationSource : public DataSource {
 public:
  ImageClassificationSource(const nlohmann::json& arch, const RunConfig& config, DataSplit split)
      : dataset_(arch.at("dataset").get<std::string>()),
        folder_(image_dataset_folder(dataset_, data_dir())),
        train_(load_idx_split(folder_, "train", idx_classes(dataset_))),
        image_size_(arch.at("image_size").get<int64_t>()),
        tokens_per_image_(arch.at("seq_len").get<int64_t>()) {
    if (split == DataSplit::kLrSearch) {
      carve_search_split(train_, val_);
    } else {
      val_ = load_idx_split(folder_, "test", idx_classes(dataset_));
      if (config.lr_auto) search_ = image_search_description(train_);
    }
    order_.emplace(config.seed, train_.size());
    const auto labels = arch.at("num_labels").get<int64_t>();
    check_usage(labels == static_cast<int64_t>(train_.class_names.size()),
                fmt::format("'{}' has {} classes but the model's head has num_labels={}", dataset_,
                            train_.class_names.size(), labels),
                fmt::format("pass --arch num_labels={}", train_.class_names.size()));
    std::tie(mean_, std_) = channel_stats(train_.pixels);
  }

  Batch train_batch(int64_t first, int64_t count) const override {
    return batch(train_, order_->items(first, count));
  }
  Batch val_batch(int64_t first, int64_t count) const override {
    return batch(val_, wrapped_items(first, count, val_.size()));
  }
  int64_t val_samples() const override { return val_.size(); }

  nlohmann::json describe() const override {
    nlohmann::json out = {
        {"dataset", dataset_},
        {"folder", folder_},
        {"train_images", train_.size()},
        {"val_images", val_.size()},
        {"source_size", {train_.pixels.size(2), train_.pixels.size(3)}},
        {"image_size", image_size_},
        {"classes", train_.class_names},
        {"normalization", {{"mean", mean_}, {"std", std_}}},
        // The loss of a model that ignores the image: ln(classes) for balanced classes.
        {"chance_loss_nats", std::log(static_cast<double>(train_.class_names.size()))}};
    if (!search_.is_null()) out["lr_search_split"] = search_;
    return out;
  }

 private:
  Batch batch(const ImageSet& set, const torch::Tensor& items) const {
    Batch b;
    b.images = preprocess_images(set.pixels.index_select(0, items), image_size_, mean_, std_);
    b.labels = set.labels.index_select(0, items);
    b.samples = items.size(0);
    b.tokens = b.samples * tokens_per_image_;
    b.targets_count = b.samples;
    return b;
  }

  std::string dataset_, folder_;
  ImageSet train_, val_;
  int64_t image_size_, tokens_per_image_;
  std::optional<EpochOrder> order_;
  std::vector<double> mean_, std_;
  nlohmann::json search_;  // a run with --lr auto: what its search split was
};

// Images with captions for a vision-language model: the emoji set (names as captions) or an
// IDX set with templated captions ("a photo of an ankle boot"; the standard test split for
// validation). The emoji set holds out every tenth base emoji for validation (load_emoji's
// groups, held_out_by_group): all variants of an emoji (skin tones, genders, directions) are
// near-copies, and an emoji whose variants are on both sides would be validated on what it
// trained on. --lr auto's search carves its split from the training side the same way. A
// caption is
// [eot] + tokens + [eot], cut to seq_len + 1 tokens: the inputs are its first seq_len
// (padded with eot), the targets the next tokens where they exist.
class VisionLanguageSource : public DataSource {
 public:
  VisionLanguageSource(const nlohmann::json& arch, const RunConfig& config, int64_t image_tokens,
                       DataSplit split)
      : dataset_(arch.at("dataset").get<std::string>()),
        folder_(image_dataset_folder(dataset_, data_dir())),
        tokenizer_(tokenizer_for(arch)),
        image_size_(arch.at("image_size").get<int64_t>()),
        seq_len_(arch.at("seq_len").get<int64_t>()),
        image_tokens_(image_tokens) {
    check_usage(seq_len_ >= 2, fmt::format("caption length {} must be at least 2", seq_len_),
                "pass --seq 32 or more");
    if (dataset_ == "emoji" ||
        std::filesystem::exists(std::filesystem::path(folder_) / "emoji.json")) {
      const ImageSet all = load_emoji(folder_);
      const auto held = held_out_by_group(all.groups, all.size(), kHeldOutEvery);
      train_ = select_images(all, held, false);
      val_ = select_images(all, held, true);
    } else {
      const auto& classes = idx_classes(dataset_);
      train_ = load_idx_split(folder_, "train", classes);
      // A search reads no validation image.
      if (split == DataSplit::kRun) val_ = load_idx_split(folder_, "test", classes);
      for (ImageSet* set : {&train_, &val_}) {
        if (set->size() == 0) continue;
        const auto* labels = set->labels.data_ptr<int64_t>();
        for (int64_t i = 0; i < set->size(); ++i)
          set->captions.push_back(templated_caption(classes[labels[i]], dataset_ == "mnist"));
      }
    }
    if (split == DataSplit::kLrSearch)
      carve_search_split(train_, val_);
    else if (config.lr_auto)
      search_ = image_search_description(train_);
    check_usage(train_.size() > 0 && val_.size() > 0,
                fmt::format("'{}' has no images to train or validate on", folder_));
    order_.emplace(config.seed, train_.size());
    std::tie(mean_, std_) = channel_stats(train_.pixels);
    train_ids_ = tokenize(train_.captions);
    val_ids_ = tokenize(val_.captions);
  }

  Batch train_batch(int64_t first, int64_t count) const override {
    return batch(train_, train_ids_, order_->items(first, count));
  }
  Batch val_batch(int64_t first, int64_t count) const override {
    return batch(val_, val_ids_, wrapped_items(first, count, val_.size()));
  }
  int64_t val_samples() const override { return val_.size(); }

  nlohmann::json describe() const override {
    double tokens = 0;
    for (const auto& ids : train_ids_) tokens += static_cast<double>(ids.size());
    nlohmann::json out = {{"dataset", dataset_},
                          {"folder", folder_},
                          {"tokenizer", tokenizer_->name()},
                          {"train_images", train_.size()},
                          {"val_images", val_.size()},
                          {"image_size", image_size_},
                          {"image_tokens", image_tokens_},
                          {"caption_positions", seq_len_},
                          {"caption_tokens_mean", tokens / static_cast<double>(train_ids_.size())},
                          {"captions_cut", truncated_},
                          {"example_captions",
                           {train_.captions.front(), train_.captions[train_.captions.size() / 2]}},
                          {"normalization", {{"mean", mean_}, {"std", std_}}}};
    if (!train_.groups.empty()) {
      const std::set<std::string> train_bases(train_.groups.begin(), train_.groups.end()),
          val_bases(val_.groups.begin(), val_.groups.end());
      out["train_base_emoji"] = train_bases.size();
      out["val_base_emoji"] = val_bases.size();
    }
    if (!search_.is_null()) out["lr_search_split"] = search_;
    return out;
  }

 private:
  // [eot] + caption + [eot], at most seq_len + 1 tokens. Repeated captions (templated ones)
  // are tokenized once.
  std::vector<std::vector<int32_t>> tokenize(const std::vector<std::string>& captions) {
    std::map<std::string, std::vector<int32_t>> cache;
    std::vector<std::vector<int32_t>> out;
    out.reserve(captions.size());
    const int32_t eot = tokenizer_->eot_id();
    for (const auto& caption : captions) {
      auto it = cache.find(caption);
      if (it == cache.end()) {
        std::vector<int32_t> ids = {eot};
        for (int32_t id : tokenizer_->encode(caption)) ids.push_back(id);
        ids.push_back(eot);
        it = cache.emplace(caption, std::move(ids)).first;
      }
      std::vector<int32_t> ids = it->second;
      if (static_cast<int64_t>(ids.size()) > seq_len_ + 1) {
        ids.resize(seq_len_ + 1);
        ++truncated_;
      }
      out.push_back(std::move(ids));
    }
    return out;
  }

  Batch batch(const ImageSet& set, const std::vector<std::vector<int32_t>>& captions,
              const torch::Tensor& items) const {
    const int64_t b = items.size(0), t = seq_len_;
    const int32_t eot = tokenizer_->eot_id();
    auto inputs = torch::full({b, t}, static_cast<int64_t>(eot), torch::kInt64);  // (B, T)
    auto targets = torch::full({b, t}, kIgnoreIndex, torch::kInt64);              // (B, T)
    auto real = torch::zeros({b, t}, torch::kBool);                               // (B, T)
    int64_t* x = inputs.data_ptr<int64_t>();
    int64_t* y = targets.data_ptr<int64_t>();
    bool* r = real.data_ptr<bool>();
    const auto* idx = items.data_ptr<int64_t>();
    int64_t count = 0;
    bool padded = false;
    for (int64_t i = 0; i < b; ++i) {
      const auto& ids = captions[idx[i]];
      const auto n = static_cast<int64_t>(ids.size());
      for (int64_t j = 0; j < std::min(n, t); ++j) {
        x[i * t + j] = ids[j];
        r[i * t + j] = true;
        if (j + 1 < n) {
          y[i * t + j] = ids[j + 1];
          ++count;
        }
      }
      padded = padded || n < t;
    }
    Batch out;
    out.images = preprocess_images(set.pixels.index_select(0, items), image_size_, mean_, std_);
    out.input_ids = inputs;
    out.targets = targets;
    if (padded) out.text_mask = real;
    out.samples = b;
    out.tokens = b * (image_tokens_ + t);
    out.targets_count = count;
    return out;
  }

  std::string dataset_, folder_;
  std::unique_ptr<Tokenizer> tokenizer_;
  int64_t image_size_, seq_len_, image_tokens_;
  ImageSet train_, val_;
  std::optional<EpochOrder> order_;
  std::vector<double> mean_, std_;
  std::vector<std::vector<int32_t>> train_ids_, val_ids_;
  int64_t truncated_ = 0;
  nlohmann::json search_;  // a run with --lr auto: what its search split was
};

// A toy problem has no data: every batch is one evaluation of its function (a "token").
class ToySource : public DataSource {
 public:
  Batch train_batch(int64_t first, int64_t count) const override { return batch(count); }
  Batch val_batch(int64_t first, int64_t count) const override { return batch(1); }
  int64_t val_samples() const override { return 1; }
  nlohmann::json describe() const override { return {{"dataset", "none (toy problem)"}}; }
  // No data, so no split: --lr auto's trials evaluate the function itself, as the run does.

 private:
  static Batch batch(int64_t count) {
    Batch b;
    b.samples = count;
    b.tokens = 1;
    b.targets_count = 1;
    return b;
  }
};

}  // namespace

static std::unique_ptr<DataSource> make_source(const ModelFamily& family,
                                               const nlohmann::json& arch, const RunConfig& config,
                                               DataSplit split) {
  check_usage(
      split != DataSplit::kAll || family.kind == ModelKind::kCausalLm ||
          family.kind == ModelKind::kMaskedLm,
      std::string("a whole data set can be evaluated for text models only, and this is a ") +
          model_kind_name(family.kind) + " model",
      "evaluate its held-out split instead (--split val)");
  switch (family.kind) {
    case ModelKind::kCausalLm:
      return std::make_unique<CausalLmSource>(arch, config, split);
    case ModelKind::kToy:
      return std::make_unique<ToySource>();
    case ModelKind::kMaskedLm:
      return std::make_unique<MaskedLmSource>(arch, config, split);
    case ModelKind::kImageClassification:
      return std::make_unique<ImageClassificationSource>(arch, config, split);
    case ModelKind::kVisionLanguage:
      if (family.image_tokens == nullptr)
        fail_runtime("a vision-language model does not say how many image tokens it has",
                     "set ModelFamily::image_tokens in models/registry.cpp");
      return std::make_unique<VisionLanguageSource>(arch, config, family.image_tokens(arch), split);
  }
  fail_usage(std::string("no data source for model kind '") + model_kind_name(family.kind) + "'");
}

std::unique_ptr<DataSource> make_data_source(const ModelFamily& family, const nlohmann::json& arch,
                                             const RunConfig& config, int64_t* resident_bytes,
                                             DataSplit split) {
  if (resident_bytes == nullptr) return make_source(family, arch, config, split);
  auto& tracker = CpuMemoryTracker::install();
  const int64_t before = tracker.current_bytes();
  auto source = make_source(family, arch, config, split);
  *resident_bytes = std::max<int64_t>(0, tracker.current_bytes() - before);
  return source;
}

}  // namespace gradscope
