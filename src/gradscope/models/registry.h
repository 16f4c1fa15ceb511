// The model registry: every architecture gradscope trains, with its presets.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gradscope/core/config.h"
#include "gradscope/core/registry.h"
#include "gradscope/models/common/memory_trace.h"
#include "gradscope/models/model.h"

namespace gradscope {

struct ModelFamily {
  // What it learns, which also picks its data: "causal-lm" (next token), "masked-lm",
  // "image-classification", "vision-language" (captions of images), or "toy" (a function
  // with a known minimum, no data).
  std::string kind;
  // The architecture of a preset: Hugging Face config names plus gradscope's "tokenizer",
  // "seq_len" and "dataset" defaults. Throws a usage error for an unknown preset.
  nlohmann::json (*preset)(const std::string& preset);
  // Parameters counted from the architecture alone (no allocation).
  int64_t (*count_params)(const nlohmann::json& arch);
  // Builds the model with weights initialised from `seed`.
  std::shared_ptr<Model> (*build)(const nlohmann::json& arch, uint64_t seed);
  // Analytical forward FLOPs per token at sequence length seq_len.
  double (*forward_flops_per_token)(const nlohmann::json& arch, int64_t seq_len);
  // The presets it has, smallest first.
  std::vector<std::string> presets = {"tiny", "small", "paper"};
  // Derives keys from others once overrides are applied (a ViT's seq_len from its image and
  // patch size); null when nothing is derived.
  void (*finalize)(nlohmann::json& arch) = nullptr;
  // The memory trace of one training step at micro-batch `batch` (`gradscope estimate`);
  // null for toy problems, whose memory is a handful of scalars.
  void (*trace_step)(const nlohmann::json& arch, int64_t batch, MemoryTrace& trace) = nullptr;
};

const Registry<ModelFamily>& model_registry();

// The architecture of the run: the preset, with the run's tokenizer, sequence length and
// dropout applied. The vocabulary is the preset's when it uses the preset's own tokenizer and
// holds its ids (ModernBERT-base's published 50368), else the tokenizer's size padded up to a
// multiple of 64.
nlohmann::json resolve_arch(const RunConfig& config);

// Applies --arch NAME=VALUE overrides to a preset's architecture: the key must exist (else a
// usage error listing those that do) and the value must have the preset value's type.
void apply_arch_overrides(const std::string& model,
                          const std::map<std::string, std::string>& overrides,
                          nlohmann::json& arch);

// Rounds a tokenizer's vocabulary size up to a multiple of 64 (tensor-core friendly).
int64_t padded_vocab(int64_t tokenizer_vocab);

}  // namespace gradscope
