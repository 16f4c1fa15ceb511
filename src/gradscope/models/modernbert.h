// ModernBERT (Warner et al. 2024, "Smarter, Better, Faster, Longer"; the paper preset is
// ModernBERT-base): a bidirectional encoder trained with masked language modelling.
//   x = dropout(layernorm(embed(ids)))
//   h = x + Wo(attn(attn_norm(x)))      attn_norm is the identity on layer 0
//   y = h + mlp(mlp_norm(h))            GeGLU: Wo(gelu(input) * gate), [input, gate] = Wi(h)
// with rotary embeddings (theta 160000 on global layers, 10000 on local ones), global
// attention on every third layer starting at layer 0 and a sliding window of
// `local_attention` tokens (half on each side) on the others, no biases anywhere and
// LayerNorm without bias; a final norm, then the MLM head dense -> gelu -> norm -> decoder,
// whose weight is tied to the embeddings (the decoder keeps a bias). The head runs on the
// masked positions only (Hugging Face's sparse prediction).
//
// The architecture uses Hugging Face's ModernBertConfig names: vocab_size, hidden_size,
// num_hidden_layers, num_attention_heads, intermediate_size (I, the GeGLU width after the
// split: Wi maps C -> 2I), global_attn_every_n_layers (3), local_attention (128),
// global_rope_theta (160000), local_rope_theta (10000), norm_eps (1e-5), norm_bias (false),
// attention_bias (false), mlp_bias (false), decoder_bias (true), initializer_range (0.02),
// plus gradscope's hidden_dropout (embedding, attention output and MLP dropout) and
// attention_dropout (attention weights), mlm_probability (0.3, read by the data), "tokenizer",
// "seq_len" and "dataset".
// Parameter names are Hugging Face's, except that q, k and v are three projections
// (attn.q_proj, ...) where Hugging Face has one fused Wqkv: the same weights, split by rows.
// Initialisation: normal(0, initializer_range) everywhere (Hugging Face truncates at 2 std and
// scales output layers down; the difference is immaterial for a benchmark from scratch).
//
// Dimension legend: B batch, T positions, C hidden size, V vocabulary, I GeGLU width,
// M masked positions in the batch.
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

struct ModernBertConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t intermediate_size = 0;
  int64_t global_attn_every_n_layers = 3;
  int64_t local_attention = 128;  // window width; each token sees local_attention / 2 each side
  double global_rope_theta = 160000.0;
  double local_rope_theta = 10000.0;
  double norm_eps = 1e-5;
  bool norm_bias = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  bool decoder_bias = true;
  double hidden_dropout = 0.0;
  double attention_dropout = 0.0;
  double initializer_range = 0.02;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  bool is_global(int64_t layer) const { return layer % global_attn_every_n_layers == 0; }
};

ModernBertConfig modernbert_config(const nlohmann::json& arch);
// The memory trace of one training step at micro-batch `batch` (memory_trace.h).
void modernbert_trace_step(const nlohmann::json& arch, int64_t batch, MemoryTrace& trace);

class ModernBertBlock : public Block {
 public:
  ModernBertBlock(const ModernBertConfig& config, int64_t layer);
  // Global layers read ctx.rope_cos/rope_sin and ctx.mask (padding, or none); local layers
  // ctx.rope_cos_local/rope_sin_local and ctx.mask_local (sliding window).
  // (B, T, C) -> (B, T, C)
  torch::Tensor forward(const torch::Tensor& x, const BlockContext& ctx) override;
  bool exposes_sublayers() const override { return true; }
  bool is_global() const { return global_; }

  LayerNorm attn_norm{nullptr};  // null on layer 0 (identity)
  SelfAttention attn{nullptr};
  LayerNorm mlp_norm{nullptr};
  GeGLU mlp{nullptr};

 private:
  bool global_ = true;
  double hidden_dropout_ = 0.0;
};

class ModernBertModel : public Model {
 public:
  explicit ModernBertModel(const ModernBertConfig& config);
  void init_weights(uint64_t seed);

  // Summed cross-entropy over targets != kIgnoreIndex (the masked positions) and their count;
  // with loss_options().chunked the decoder's projection and the cross-entropy run over chunks
  // of positions (common/lm_loss.h).
  LossOutput loss(const Batch& batch) override;
  std::vector<std::shared_ptr<Block>> blocks() override { return {blocks_.begin(), blocks_.end()}; }
  bool has_lm_head() const override { return true; }

  // The masks and rotary tables of a forward over `seq_len` positions; `real` (B, T) bool
  // marks non-padding positions (undefined: none is padding).
  BlockContext context(int64_t seq_len, const torch::Device& device, const torch::Tensor& real);
  // (B, T) int64 -> (B, T, C), after the final norm
  torch::Tensor encode(const torch::Tensor& input_ids, const torch::Tensor& real = {});
  // MLM head on selected hidden states: (M, C) -> (M, V)
  torch::Tensor mlm_logits(const torch::Tensor& hidden);
  // The MLM head before its decoder (dense, GELU, norm): (M, C) -> (M, C)
  torch::Tensor mlm_hidden(const torch::Tensor& hidden);

  const ModernBertConfig& config() const { return config_; }

  torch::nn::Embedding tok_embeddings{nullptr};  // (V, C)
  LayerNorm embedding_norm{nullptr};
  torch::nn::ModuleList layers{nullptr};
  LayerNorm final_norm{nullptr};
  torch::nn::Linear head_dense{nullptr};  // C -> C
  LayerNorm head_norm{nullptr};
  torch::Tensor decoder_bias;  // (V), undefined without decoder bias

 private:
  ModernBertConfig config_;
  std::vector<std::shared_ptr<ModernBertBlock>> blocks_;
  RotaryCache global_rope_, local_rope_;
  torch::Tensor window_mask_;  // cached sliding-window mask of the last length and device
};

nlohmann::json modernbert_preset(const std::string& preset);
// Parameters with the MLM head (dense, norm, decoder bias; the decoder weight is tied).
int64_t modernbert_count_params(const nlohmann::json& arch);
// The encoder alone, as the model card counts it (149,014,272 for base).
int64_t modernbert_encoder_params(const nlohmann::json& arch);
// Forward FLOPs per position: every layer's matmuls and attention over the full T x T matrix
// (the kernels compute it whatever the window), plus the MLM head on the fraction
// mlm_probability of the positions it runs on.
double modernbert_forward_flops_per_token(const nlohmann::json& arch, int64_t seq_len);
std::shared_ptr<Model> make_modernbert(const nlohmann::json& arch, uint64_t seed);

}  // namespace gradscope
