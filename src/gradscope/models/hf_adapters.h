// LoRA's adapters as PEFT saves them (adapter_config.json and adapter_model.safetensors), both
// ways: gradscope's adapters written for peft.PeftModel.from_pretrained, and a PEFT folder's
// adapters (PEFT's own LoraConfig, or gradscope's) read into gradscope's (docs/lora.md).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "gradscope/models/model.h"

namespace gradscope {

// LoRA's adapters as PEFT saves them (adapter_model.safetensors and adapter_config.json), for
// loading onto the published base model with peft.PeftModel.from_pretrained: tensors
// "base_model.model.<published module>.lora_A.weight" (r, in) and ".lora_B.weight" (out, r),
// and the trainable heads (lora_trainable: ViT's classifier) under their published names.
// Where gradscope adapts separate projections that the published model stacks into one
// (ModernBERT's Wqkv, nanoVLM's qkv_proj), the stacked module gets one adapter of rank k r
// for k adapted parts: A the parts' A stacked, B block-diagonal, alpha k alpha, so the
// update is the same (PEFT's rank_pattern and alpha_pattern carry them).
struct AdapterExport {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  nlohmann::json config;  // adapter_config.json
};
AdapterExport hf_adapters(const std::string& model, Model& m, const LoraOptions& options,
                          const std::string& base_model);

// Copies a PEFT folder's adapters into the adapters that add_lora attached to `m` with
// `options`. `config` is its adapter_config.json, `tensors` its adapter_model.safetensors,
// `source` the folder (for messages). The folder must be LoRA of this model's published modules
// with r and lora_alpha equal to options' (a module's rank_pattern and alpha_pattern entries
// may differ when alpha / r is the same: the update's scale), no DoRA, rsLoRA, bias or
// fan_in_fan_out; it must hold an adapter for every module whose layers `options` adapts and no
// other, with the published shapes. A stacked module (ModernBERT's Wqkv, nanoVLM's qkv_proj)
// is read into its parts' adapters either way it can be written: one adapter of rank r over
// all its rows (PEFT's own), each part's adapter sharing A and taking its rows of B, the rows
// of a part gradscope does not adapt being zero; or gradscope's rank k r with B block-diagonal.
// Tensors of the heads that train beside the adapters (lora_trainable: ViT's classifier) are
// copied into the model. Everything is checked before anything is copied; a usage error
// names the folder and the tensor or key.
void load_hf_adapters(const std::string& model, Model& m, const LoraOptions& options,
                      const nlohmann::json& config,
                      const std::map<std::string, torch::Tensor>& tensors,
                      const std::string& source);

}  // namespace gradscope
