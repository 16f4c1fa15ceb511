// Vision Transformer (Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words"; the paper
// preset is ViT-B/16): a convolutional patch embedding, a learned class token, learned
// position embeddings, L pre-norm encoder blocks
//   h = x + dropout(attn(layernorm(x)))        bidirectional multi-head attention, biases
//   y = h + dropout(fc2(gelu(fc1(layernorm(h)))))
// a final LayerNorm and a linear classification head on the class token.
//
// The encoder without class token and head is SigLIP's vision tower (Zhai et al. 2023), which
// NanoVLM reuses: VisionEncoder serves both.
//
// The architecture is a JSON object with Hugging Face's ViTConfig names: hidden_size,
// num_hidden_layers, num_attention_heads, intermediate_size, image_size, patch_size,
// num_labels (required); num_channels (3), layer_norm_eps (1e-12), qkv_bias (true),
// hidden_act ("gelu", or "gelu_pytorch_tanh" as SigLIP), initializer_range (0.02), plus
// gradscope's hidden_dropout (ViT's hidden_dropout_prob: after the position embeddings and
// on each residual branch, as transformers' ViTForImageClassification) and attention_dropout (on the attention weights),
// "dataset" and "seq_len" (patches + 1, derived).
//
// Dimension legend: B batch, N patches, T tokens (N + 1 with the class token), C hidden
// size, I MLP size, P patch size, K classes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "gradscope/models/common/layers.h"
#include "gradscope/models/common/memory_trace.h"
#include "gradscope/models/model.h"

namespace gradscope {

struct VisionConfig {
  int64_t hidden_size = 0;          // C
  int64_t num_hidden_layers = 0;    // L
  int64_t num_attention_heads = 0;  // NH
  int64_t intermediate_size = 0;    // I
  int64_t image_size = 0;           // H = W
  int64_t patch_size = 0;           // P, divides image_size
  int64_t num_channels = 3;
  double layer_norm_eps = 1e-12;
  bool qkv_bias = true;
  bool gelu_tanh = false;   // hidden_act "gelu_pytorch_tanh"
  bool class_token = true;  // ViT: yes; SigLIP: no
  double hidden_dropout = 0.0;
  double attention_dropout = 0.0;
  double initializer_range = 0.02;

  int64_t num_patches() const { return (image_size / patch_size) * (image_size / patch_size); }
  int64_t num_tokens() const { return num_patches() + (class_token ? 1 : 0); }
};

// Parses the vision keys of `arch`. `prefix` is prepended to the per-layer keys
// (NanoVLM writes vision_hidden_size, ...); image_size and patch_size are never prefixed.
VisionConfig vision_config(const nlohmann::json& arch, const std::string& model,
                           const std::string& prefix = "");
int64_t vision_count_params(const VisionConfig& c);
// The vision encoder's part of a memory trace (memory_trace.h): the images, patches, blocks
// and final norm; returns the normed hidden states (B, T, C).
MemoryTrace::Id trace_vision_encoder(const VisionConfig& c, int64_t batch, MemoryTrace& trace);
// The memory trace of one ViT training step at micro-batch `batch`.
void vit_trace_step(const nlohmann::json& arch, int64_t batch, MemoryTrace& trace);
// Forward FLOPs of the encoder for one image (2 per multiply-add; matmuls, the patch
// convolution, and attention scores and sums over the full T x T matrix).
double vision_forward_flops_per_image(const VisionConfig& c);

// One pre-norm encoder layer.
class EncoderBlock : public Block {
 public:
  explicit EncoderBlock(const VisionConfig& config);
  // (B, T, C) -> (B, T, C); no mask (every token sees every token)
  torch::Tensor forward(const torch::Tensor& x, const BlockContext& ctx) override;
  bool exposes_sublayers() const override { return true; }

  LayerNorm layernorm_before{nullptr};
  SelfAttention attention{nullptr};
  LayerNorm layernorm_after{nullptr};
  GeluMLP mlp{nullptr};

 private:
  double hidden_dropout_ = 0.0;
};

// Patch embedding, optional class token, position embeddings, blocks and the final norm.
class VisionEncoderImpl : public torch::nn::Module {
 public:
  explicit VisionEncoderImpl(const VisionConfig& config);
  // Draws the weights from `gen` (layers in order, then class token and positions).
  void init_weights(at::Generator& gen);
  // (B, 3, H, W) -> (B, T, C), after the final norm. `run` calls one block (the owning
  // model's block runner, so that a strategy's checkpointing reaches these blocks too).
  torch::Tensor forward(const torch::Tensor& images, const BlockRunner& run);

  const VisionConfig& config() const { return config_; }
  std::vector<std::shared_ptr<Block>> blocks() const { return {blocks_.begin(), blocks_.end()}; }

  PatchEmbedding patch_embeddings{nullptr};
  torch::Tensor cls_token;            // (1, 1, C), undefined without a class token
  torch::Tensor position_embeddings;  // (1, T, C)
  torch::nn::ModuleList layers{nullptr};
  LayerNorm layernorm{nullptr};

 private:
  VisionConfig config_;
  std::vector<std::shared_ptr<EncoderBlock>> blocks_;
};
TORCH_MODULE(VisionEncoder);

class ViTModel : public Model {
 public:
  ViTModel(const VisionConfig& config, int64_t num_labels);
  void init_weights(uint64_t seed);

  // Summed cross-entropy of the class-token logits against batch.labels; target_count = B and
  // `correct` counts right arg-max predictions.
  LossOutput loss(const Batch& batch) override;
  std::vector<std::shared_ptr<Block>> blocks() override { return encoder->blocks(); }
  // (B, 3, H, W) -> (B, K)
  torch::Tensor logits(const torch::Tensor& images);
  // With LoRA the classifier trains too: it starts untrained for the task's labels.
  std::vector<std::string> lora_trainable() const override { return {"classifier"}; }

  VisionEncoder encoder{nullptr};
  torch::nn::Linear classifier{nullptr};  // C -> K
};

// Presets "tiny", "small", "paper" (docs/usage.md, "Models").
nlohmann::json vit_preset(const std::string& preset);
int64_t vit_count_params(const nlohmann::json& arch);
// Forward FLOPs per token (patches and class token), head included, at the architecture's
// own token count (seq_len is derived from image and patch size and must equal it).
double vit_forward_flops_per_token(const nlohmann::json& arch, int64_t seq_len);
// Sets seq_len = patches + 1 from the (possibly overridden) image and patch size.
void vit_finalize_arch(nlohmann::json& arch);
std::shared_ptr<Model> make_vit(const nlohmann::json& arch, uint64_t seed);

}  // namespace gradscope
