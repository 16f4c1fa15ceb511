#include "gradscope/models/registry.h"

#include "gradscope/core/error.h"
#include "gradscope/data/tokenizer.h"
#include "gradscope/models/llama.h"
#include "gradscope/models/modernbert.h"
#include "gradscope/models/nanovlm.h"
#include "gradscope/models/toy.h"
#include "gradscope/models/vit.h"

namespace gradscope {

Batch Batch::to(const torch::Device& device) const {
  Batch out = *this;
  auto move = [&](const torch::Tensor& t) { return t.defined() ? t.to(device) : t; };
  out.input_ids = move(input_ids);
  out.targets = move(targets);
  out.images = move(images);
  out.labels = move(labels);
  out.text_mask = move(text_mask);
  return out;
}

const Registry<ModelFamily>& model_registry() {
  static const Registry<ModelFamily> registry = [] {
    Registry<ModelFamily> r("model");
    r.add("llama", "Llama 3 decoder (paper: Llama 3.2 1B), causal language modelling",
          {"causal-lm",
           llama_preset,
           llama_count_params,
           make_llama,
           llama_forward_flops_per_token,
           {"tiny", "small", "paper"},
           nullptr,
           llama_trace_step});
    r.add("vit", "Vision Transformer (paper: ViT-B/16), image classification",
          {"image-classification",
           vit_preset,
           vit_count_params,
           make_vit,
           vit_forward_flops_per_token,
           {"tiny", "small", "paper"},
           vit_finalize_arch,
           vit_trace_step});
    r.add("modernbert", "ModernBERT encoder (paper: ModernBERT-base), masked language modelling",
          {"masked-lm",
           modernbert_preset,
           modernbert_count_params,
           make_modernbert,
           modernbert_forward_flops_per_token,
           {"tiny", "small", "paper"},
           nullptr,
           modernbert_trace_step});
    r.add("nanovlm",
          "vision-language model (paper: nanoVLM-222M, SigLIP + SmolLM2), image captioning",
          {"vision-language",
           nanovlm_preset,
           nanovlm_count_params,
           make_nanovlm,
           nanovlm_forward_flops_per_token,
           {"tiny", "small", "paper"},
           nullptr,
           nanovlm_trace_step});
    r.add("quadratic", "toy: n-dimensional quadratic with a set condition number, known minimum",
          {"toy",
           quadratic_preset,
           toy_count_params,
           make_quadratic,
           quadratic_forward_flops,
           {"tiny", "small"}});
    r.add("rosenbrock", "toy: n-dimensional Rosenbrock function, minimum at (1, ..., 1)",
          {"toy",
           rosenbrock_preset,
           toy_count_params,
           make_rosenbrock,
           rosenbrock_forward_flops,
           {"tiny", "small"}});
    return r;
  }();
  return registry;
}

void apply_arch_overrides(const std::string& model,
                          const std::map<std::string, std::string>& overrides,
                          nlohmann::json& arch) {
  static const std::map<std::string, std::string> dedicated = {
      {"tokenizer", "--tokenizer"},
      {"dataset", "--dataset"},
      {"seq_len", "--seq"},
      {"vocab_size", "--tokenizer (the vocabulary follows the tokenizer)"},
      {"hidden_dropout", "--dropout"},
      {"attention_dropout", "--dropout"}};
  for (const auto& [key, text] : overrides) {
    if (auto it = dedicated.find(key); it != dedicated.end())
      fail_usage("--arch " + key + " is not an architecture override", "use " + it->second);
    if (!arch.contains(key)) {
      std::string keys;
      for (const auto& [k, v] : arch.items())
        if (!dedicated.count(k) && !v.is_object()) keys += (keys.empty() ? "" : ", ") + k;
      fail_usage("model '" + model + "' has no architecture key '" + key + "'",
                 "keys that --arch can set: " + keys);
    }
    nlohmann::json& slot = arch[key];
    nlohmann::json value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    const bool fits =
        !value.is_discarded() && ((slot.is_number_integer() && value.is_number_integer()) ||
                                  (slot.is_number_float() && value.is_number()) ||
                                  (slot.is_boolean() && value.is_boolean()) || slot.is_null());
    if (slot.is_string()) {
      slot = text;
      continue;
    }
    const char* expected = slot.is_number_integer() ? "a whole number"
                           : slot.is_number()       ? "a number"
                           : slot.is_boolean()      ? "true or false"
                                                    : "a JSON value";
    check_usage(fits, "--arch " + key + "=" + text + " is not " + expected,
                fmt::format("the preset has {}={}", key, slot.dump()));
    slot = slot.is_number_float() ? nlohmann::json(value.get<double>()) : value;
  }
}

int64_t padded_vocab(int64_t tokenizer_vocab) { return (tokenizer_vocab + 63) / 64 * 64; }

nlohmann::json resolve_arch(const RunConfig& config) {
  const ModelFamily& family = model_registry().get(config.model);
  nlohmann::json arch = family.preset(config.preset);
  if (family.kind == "toy")
    check_usage(config.tokenizer.empty() && config.dataset.empty() && !config.dropout &&
                    config.seq_len <= 0,
                "toy problem '" + config.model +
                    "' takes no --tokenizer, --dataset, --dropout "
                    "or --seq",
                "set its size with --arch dim=N (and --arch condition=K for the quadratic)");
  apply_arch_overrides(config.model, config.arch_overrides, arch);
  if (family.kind == "image-classification")
    check_usage(config.tokenizer.empty() && config.seq_len <= 0,
                "model '" + config.model + "' reads images: it takes no --tokenizer or --seq",
                "its tokens are the image's patches: change --arch image_size=N or patch_size=N");
  const std::string preset_tokenizer = arch.value("tokenizer", "");
  if (!config.tokenizer.empty()) {
    tokenizer_registry().get(config.tokenizer);  // validates the name
    arch["tokenizer"] = config.tokenizer;
  }
  if (arch.contains("tokenizer")) {
    const auto& tok = tokenizer_registry().get(arch["tokenizer"].get<std::string>());
    const int64_t preset_vocab = arch.value("vocab_size", int64_t{0});
    const bool keep = arch["tokenizer"] == preset_tokenizer && preset_vocab >= tok.vocab_size;
    if (!keep) arch["vocab_size"] = padded_vocab(tok.vocab_size);
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
  if (family.finalize) family.finalize(arch);
  return arch;
}

}  // namespace gradscope
