// The model registry: every architecture gradscope trains, with its presets and what it
// supports. Code outside the registry asks a family's entry, never its name, what it has.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gradscope/core/registry.h"
#include "gradscope/models/block_flops.h"
#include "gradscope/models/common/memory_trace.h"
#include "gradscope/models/model.h"

namespace gradscope {

// What a model learns, which also picks its data.
enum class ModelKind {
  kCausalLm,             // next token
  kMaskedLm,             // masked tokens
  kImageClassification,  // labelled images
  kVisionLanguage,       // captions of images
  kToy,                  // a function with a known minimum, no data
};
// "causal-lm", "masked-lm", "image-classification", "vision-language", "toy".
const char* model_kind_name(ModelKind kind);

// A family's published weight and config names (hf_weights_detail.h).
struct PublishedNames;

struct ModelFamily {
  ModelKind kind;
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
  // Vision-language models: the image tokens the decoder sees before the caption, which the
  // data source leaves without targets; null for the other kinds.
  int64_t (*image_tokens)(const nlohmann::json& arch) = nullptr;
  // The forward FLOPs of each block of model.blocks() at sequence length seq_len, split as
  // checkpointing splits a block (`gradscope estimate`'s recompute); null for toy problems.
  std::vector<BlockFlops> (*block_flops)(const nlohmann::json& arch, int64_t seq_len) = nullptr;
  // Its published names (Hugging Face's, nanoVLM's own): the tensors' and config.json's, for
  // --init-from, --save-weights and `gradscope convert`; null when it has none (the toys).
  const PublishedNames* published = nullptr;
};

const Registry<ModelFamily>& model_registry();

// Applies --arch NAME=VALUE overrides to a preset's architecture: the key must exist (else a
// usage error listing those that do) and the value must have the preset value's type.
void apply_arch_overrides(const std::string& model,
                          const std::map<std::string, std::string>& overrides,
                          nlohmann::json& arch);

// Rounds a tokenizer's vocabulary size up to a multiple of 64 (tensor-core friendly).
int64_t padded_vocab(int64_t tokenizer_vocab);

}  // namespace gradscope
