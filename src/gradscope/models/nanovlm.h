// NanoVLM (Wiedmann et al. 2025, huggingface/nanoVLM; the paper preset is nanoVLM-222M): a
// SigLIP-style vision encoder (no class token, GELU with tanh, LayerNorm 1e-6), a modality
// projector that pixel-shuffles the patch grid by a factor s (s x s neighbouring patches
// become one token of s^2 x C_vision) and maps it linearly (no bias) to the decoder width,
// and a SmolLM2-style Llama decoder (LlamaBlock, tied head) reading the image tokens first,
// then the caption:
//   [img_1 .. img_n, caption_0 .. caption_{T-1}]  -> causal decoder -> logits of the caption
// The loss is the next-token cross-entropy of the caption positions only: image positions
// have no targets, by construction (their logits are never computed).
//
// The architecture is flat so that --arch reaches every key: the decoder keys are
// LlamaConfig's (hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
// intermediate_size, rope_theta, rms_norm_eps, tie_word_embeddings, vocab_size, ...), the
// vision keys carry a "vision_" prefix (vision_hidden_size, vision_num_hidden_layers,
// vision_num_attention_heads, vision_intermediate_size, vision_layer_norm_eps,
// vision_hidden_act) except image_size and patch_size, and pixel_shuffle_factor is the
// projector's. "seq_len" is the caption length in tokens (padded); the decoder sees
// image tokens + seq_len positions.
//
// Dimension legend: B batch, N patches, n image tokens (N / s^2), Cv vision width, C decoder
// width, T caption positions, V vocabulary.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "gradscope/models/llama.h"
#include "gradscope/models/vit.h"

namespace gradscope {

// (B, N, Cv) -> (B, N / s^2, s^2 * Cv): the sqrt(N) x sqrt(N) grid is cut into s x s cells,
// each cell's tokens concatenated in row-major order (nanoVLM's pixel_shuffle).
torch::Tensor pixel_shuffle_tokens(const torch::Tensor& x, int64_t factor);

struct NanoVlmConfig {
  VisionConfig vision;
  LlamaConfig decoder;
  int64_t pixel_shuffle_factor = 2;
  int64_t image_tokens() const {
    return vision.num_patches() / (pixel_shuffle_factor * pixel_shuffle_factor);
  }
};

NanoVlmConfig nanovlm_config(const nlohmann::json& arch);
// The image tokens the decoder sees before the caption (ModelFamily::image_tokens).
int64_t nanovlm_image_tokens(const nlohmann::json& arch);
// The memory trace of one training step at micro-batch `batch` (memory_trace.h).
void nanovlm_trace_step(const nlohmann::json& arch, int64_t batch, MemoryTrace& trace);

class NanoVlmModel : public Model {
 public:
  explicit NanoVlmModel(const NanoVlmConfig& config);
  void init_weights(uint64_t seed);

  // Summed next-token cross-entropy over the caption's targets != kIgnoreIndex.
  // batch.images (B, 3, H, W), batch.input_ids and batch.targets (B, T), batch.text_mask
  // (B, T) when captions are padded.
  // With loss_options().chunked, over chunks of caption positions (common/lm_loss.h).
  LossOutput loss(const Batch& batch) override;
  // Vision blocks first, then decoder blocks.
  std::vector<std::shared_ptr<Block>> blocks() override;
  bool has_lm_head() const override { return true; }
  // LoRA adapts the decoder's projections; the vision encoder and the projector stay frozen.
  std::string lora_scope() const override { return "decoder"; }

  // (B, 3, H, W) -> (B, n, C): encoder, pixel shuffle, projection
  torch::Tensor image_tokens(const torch::Tensor& images);
  // Logits of the caption positions: (B, 3, H, W), (B, T), (B, T) bool or undefined
  // -> (B, T, V)
  torch::Tensor logits(const torch::Tensor& images, const torch::Tensor& input_ids,
                       const torch::Tensor& text_mask = {});
  // The decoder's output at the caption positions, after its final norm (what logits()
  // projects to the vocabulary): same arguments -> (B, T, C)
  torch::Tensor caption_hidden(const torch::Tensor& images, const torch::Tensor& input_ids,
                               const torch::Tensor& text_mask = {});

  const NanoVlmConfig& config() const { return config_; }

  VisionEncoder vision{nullptr};
  torch::nn::Linear projector{nullptr};  // s^2 Cv -> C, no bias
  std::shared_ptr<LlamaModel> decoder;

 private:
  NanoVlmConfig config_;
};

nlohmann::json nanovlm_preset(const std::string& preset);
int64_t nanovlm_count_params(const nlohmann::json& arch);
// Forward FLOPs per decoder position (image tokens + seq_len caption positions): the vision
// encoder and projector of one image spread over the sample's positions, plus the decoder's
// matmuls and attention at that length, with the LM head on the caption positions only.
double nanovlm_forward_flops_per_token(const nlohmann::json& arch, int64_t seq_len);
std::shared_ptr<Model> make_nanovlm(const nlohmann::json& arch, uint64_t seed);

}  // namespace gradscope
