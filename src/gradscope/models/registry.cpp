#include "gradscope/models/registry.h"

#include "gradscope/core/error.h"
#include "gradscope/data/tokenizer.h"
#include "gradscope/models/llama.h"

namespace gradscope {

Batch Batch::to(const torch::Device& device) const {
  Batch out = *this;
  auto move = [&](const torch::Tensor& t) { return t.defined() ? t.to(device) : t; };
  out.input_ids = move(input_ids);
  out.targets = move(targets);
  out.images = move(images);
  out.labels = move(labels);
  return out;
}

const Registry<ModelFamily>& model_registry() {
  static const Registry<ModelFamily> registry = [] {
    Registry<ModelFamily> r("model");
    r.add(
        "llama", "Llama 3 decoder (paper: Llama 3.2 1B), causal language modelling",
        {"causal-lm", llama_preset, llama_count_params, make_llama, llama_forward_flops_per_token});
    return r;
  }();
  return registry;
}

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names = {"tiny", "small", "paper"};
  return names;
}

int64_t padded_vocab(int64_t tokenizer_vocab) { return (tokenizer_vocab + 63) / 64 * 64; }

nlohmann::json resolve_arch(const RunConfig& config) {
  const ModelFamily& family = model_registry().get(config.model);
  nlohmann::json arch = family.preset(config.preset);
  if (!config.tokenizer.empty()) {
    tokenizer_registry().get(config.tokenizer);  // validates the name
    arch["tokenizer"] = config.tokenizer;
  }
  if (arch.contains("tokenizer")) {
    const auto& tok = tokenizer_registry().get(arch["tokenizer"].get<std::string>());
    arch["vocab_size"] = padded_vocab(tok.vocab_size);
  }
  if (config.seq_len > 0) arch["seq_len"] = config.seq_len;
  if (!config.dataset.empty()) arch["dataset"] = config.dataset;
  if (config.dropout) {
    check_usage(*config.dropout >= 0 && *config.dropout < 1,
                fmt::format("dropout {} must lie in [0, 1)", *config.dropout),
                "pass --dropout 0 to turn dropout off, or a probability below 1");
    arch["hidden_dropout"] = *config.dropout;
    arch["attention_dropout"] = *config.dropout;
  }
  return arch;
}

}  // namespace gradscope
