#include "gradscope/models/registry.h"

#include "gradscope/core/error.h"
#include "gradscope/core/json_input.h"
#include "gradscope/models/block_flops.h"
#include "gradscope/models/hf_weights_detail.h"
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

const char* model_kind_name(ModelKind kind) {
  switch (kind) {
    case ModelKind::kCausalLm:
      return "causal-lm";
    case ModelKind::kMaskedLm:
      return "masked-lm";
    case ModelKind::kImageClassification:
      return "image-classification";
    case ModelKind::kVisionLanguage:
      return "vision-language";
    case ModelKind::kToy:
      return "toy";
  }
  return "?";
}

namespace {

namespace hfd = hf_weights_detail;
const PublishedNames kLlamaNames{hfd::llama_layout_of_arch, hfd::llama_layout_of_model,
                                 hfd::llama_config_names,   hfd::llama_write_derived,
                                 hfd::llama_read_special,   "CAUSAL_LM"};
const PublishedNames kVitNames{hfd::vit_layout_of_arch, hfd::vit_layout_of_model,
                               hfd::vit_config_names,   hfd::vit_write_derived,
                               hfd::vit_read_special,   nullptr,
                               hfd::vit_adapter_module};
const PublishedNames kModernBertNames{hfd::modernbert_layout_of_arch,
                                      hfd::modernbert_layout_of_model,
                                      hfd::modernbert_config_names,
                                      hfd::modernbert_write_derived,
                                      hfd::modernbert_read_special,
                                      nullptr};
const PublishedNames kNanoVlmNames{hfd::nanovlm_layout_of_arch, hfd::nanovlm_layout_of_model,
                                   hfd::nanovlm_config_names,   hfd::nanovlm_write_derived,
                                   nullptr,                    nullptr};

}  // namespace

const Registry<ModelFamily>& model_registry() {
  static const Registry<ModelFamily> registry = [] {
    Registry<ModelFamily> r("model");
    r.add("llama", "Llama 3 decoder (paper: Llama 3.2 1B), causal language modelling",
          {ModelKind::kCausalLm,
           llama_preset,
           llama_count_params,
           make_llama,
           llama_forward_flops_per_token,
           {"tiny", "small", "paper"},
           nullptr,
           llama_trace_step,
           nullptr,
           llama_block_flops,
           &kLlamaNames});
    r.add("vit", "Vision Transformer (paper: ViT-B/16), image classification",
          {ModelKind::kImageClassification,
           vit_preset,
           vit_count_params,
           make_vit,
           vit_forward_flops_per_token,
           {"tiny", "small", "paper"},
           vit_finalize_arch,
           vit_trace_step,
           nullptr,
           vit_block_flops,
           &kVitNames});
    r.add("modernbert", "ModernBERT encoder (paper: ModernBERT-base), masked language modelling",
          {ModelKind::kMaskedLm,
           modernbert_preset,
           modernbert_count_params,
           make_modernbert,
           modernbert_forward_flops_per_token,
           {"tiny", "small", "paper"},
           nullptr,
           modernbert_trace_step,
           nullptr,
           modernbert_block_flops,
           &kModernBertNames});
    r.add("nanovlm",
          "vision-language model (paper: nanoVLM-222M, SigLIP + SmolLM2), image captioning",
          {ModelKind::kVisionLanguage,
           nanovlm_preset,
           nanovlm_count_params,
           make_nanovlm,
           nanovlm_forward_flops_per_token,
           {"tiny", "small", "paper"},
           nullptr,
           nanovlm_trace_step,
           nanovlm_image_tokens,
           nanovlm_block_flops,
           &kNanoVlmNames});
    r.add("quadratic", "toy: n-dimensional quadratic with a set condition number, known minimum",
          {ModelKind::kToy,
           quadratic_preset,
           toy_count_params,
           make_quadratic,
           quadratic_forward_flops,
           {"tiny", "small"}});
    r.add("rosenbrock", "toy: n-dimensional Rosenbrock function, minimum at (1, ..., 1)",
          {ModelKind::kToy,
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
    const std::optional<nlohmann::json> parsed = try_parse_json(text, nullptr);
    const nlohmann::json value = parsed ? *parsed : nlohmann::json();
    const bool fits =
        parsed.has_value() && ((slot.is_number_integer() && value.is_number_integer()) ||
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

}  // namespace gradscope
