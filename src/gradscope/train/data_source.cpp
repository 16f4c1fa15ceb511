#include "gradscope/train/data_source.h"

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/data/text.h"
#include "gradscope/data/tokenizer.h"

namespace gradscope {
namespace {

// Next-token prediction over windows of a tokenized corpus.
class CausalLmSource : public DataSource {
 public:
  CausalLmSource(const nlohmann::json& arch, const RunConfig& config)
      : dataset_(arch.at("dataset").get<std::string>()),
        tokenizer_(make_tokenizer(arch.at("tokenizer").get<std::string>(), data_dir())),
        corpus_(dataset_, *tokenizer_, data_dir(), arch.at("seq_len").get<int64_t>(), config.seed) {
    const int64_t vocab = arch.at("vocab_size").get<int64_t>();
    check_usage(tokenizer_->vocab_size() <= vocab,
                fmt::format("tokenizer '{}' has {} ids but the model's vocabulary is {}",
                            tokenizer_->name(), tokenizer_->vocab_size(), vocab),
                "choose a tokenizer that fits the preset, or leave --tokenizer unset");
  }

  Batch train_batch(int64_t first, int64_t count) const override {
    return to_batch(corpus_.train_batch(first, count));
  }
  Batch val_batch(int64_t first, int64_t count) const override {
    return to_batch(corpus_.val_batch(first, count));
  }
  int64_t val_samples() const override { return corpus_.val_windows(); }

  nlohmann::json describe() const override {
    return {
        {"dataset", dataset_},
        {"tokenizer", tokenizer_->name()},
        {"train_tokens", corpus_.train_tokens()},
        {"val_tokens", corpus_.val_tokens()},
        {"train_windows", corpus_.train_windows()},
        {"unigram_entropy_nats", unigram_entropy_nats(corpus_.tokens(), 0, corpus_.split_index())}};
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
};

// A toy problem has no data: every batch is one evaluation of its function (a "token").
class ToySource : public DataSource {
 public:
  Batch train_batch(int64_t first, int64_t count) const override { return batch(count); }
  Batch val_batch(int64_t first, int64_t count) const override { return batch(1); }
  int64_t val_samples() const override { return 1; }
  nlohmann::json describe() const override { return {{"dataset", "none (toy problem)"}}; }

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

std::unique_ptr<DataSource> make_data_source(const std::string& kind, const nlohmann::json& arch,
                                             const RunConfig& config) {
  if (kind == "causal-lm") return std::make_unique<CausalLmSource>(arch, config);
  if (kind == "toy") return std::make_unique<ToySource>();
  fail_usage("no data source for model kind '" + kind + "'");
}

}  // namespace gradscope
