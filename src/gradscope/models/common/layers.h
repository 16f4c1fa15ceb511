// Transformer building blocks shared by the models: RMSNorm, rotary position embeddings
// (with Llama 3 frequency scaling), scaled dot-product attention with grouped-query
// support, a self-attention module and the SwiGLU MLP. Parameter names follow Hugging Face
// (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, weight) so that weights
// map one to one.
//
// Dimension legend: B batch, T query positions, S key positions (S == T in self-attention),
// C hidden size, NH query heads, NKV key/value heads, HS head size, I MLP intermediate size.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

#include <torch/torch.h>

namespace gradscope {

// ---------------------------------------------------------------------------------------
// RMSNorm (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps) * weight, no mean subtraction
// and no bias. Computed in float32 whatever the input dtype, as Hugging Face's LlamaRMSNorm.

struct RMSNormOptions {
  /* implicit */ RMSNormOptions(int64_t dim) : dim_(dim) {}
  TORCH_ARG(int64_t, dim);
  // Added to the mean square; Llama 3 uses 1e-5, Hugging Face's default is 1e-6.
  TORCH_ARG(double, eps) = 1e-6;
};

class RMSNormImpl : public torch::nn::Cloneable<RMSNormImpl> {
 public:
  explicit RMSNormImpl(const RMSNormOptions& options);
  void reset() override;
  void reset_parameters();  // weight = 1
  // (..., C) -> (..., C)
  torch::Tensor forward(const torch::Tensor& x);

  RMSNormOptions options;
  torch::Tensor weight;  // (C)
};
TORCH_MODULE(RMSNorm);

// ---------------------------------------------------------------------------------------
// Rotary position embeddings (Su et al. 2021, RoFormer) in Hugging Face's layout: the
// rotated pairs are (j, j + HS/2), not interleaved (j, j+1), and the tables repeat the
// HS/2 frequencies twice so that apply_rotary is two multiplies and a rotate_half.

// Llama 3 frequency scaling (rope_type "llama3"): wavelengths longer than
// original_max_position_embeddings / low_freq_factor are stretched by `factor`, shorter than
// original_max_position_embeddings / high_freq_factor are kept, and the band between is
// interpolated smoothly. Defaults are Llama 3.1's; Llama 3.2 1B uses factor 32.
struct Llama3RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192;
};

struct RotaryOptions {
  /* implicit */ RotaryOptions(int64_t head_size) : head_size_(head_size) {}
  TORCH_ARG(int64_t, head_size);       // HS, even
  TORCH_ARG(double, theta) = 10000.0;  // rope_theta: the base of the frequencies
  TORCH_ARG(std::optional<Llama3RopeScaling>, llama3_scaling) = std::nullopt;
};

// The HS/2 inverse frequencies theta^(-2j/HS), float32, Llama 3 scaling applied when set.
// Mirrors Hugging Face's _compute_default_rope_parameters and _compute_llama3_parameters
// operation for operation (the same float32 ops in the same order), so that the roundings
// are the same too.
torch::Tensor rope_inv_freq(const RotaryOptions& options);  // (HS/2) float32

struct RopeTables {
  torch::Tensor cos;  // (T, HS) float32
  torch::Tensor sin;  // (T, HS) float32
};

// Tables for positions 0..seq_len-1, computed on the CPU and moved to `device`.
RopeTables rope_tables(const RotaryOptions& options, int64_t seq_len,
                       const torch::Device& device = torch::kCPU);

// Rotates x by the tables: x * cos + rotate_half(x) * sin, where
// rotate_half(x) = cat(-x[..., HS/2:], x[..., :HS/2]). The tables are cast to x's dtype
// (as Hugging Face does), so bf16 activations stay bf16.
// x (B, NH, T, HS), cos/sin (T, HS) -> (B, NH, T, HS)
torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos,
                           const torch::Tensor& sin);

// Caches the tables of the last (seq_len, device) asked for, so that a model computes them
// once rather than once per forward.
class RotaryCache {
 public:
  explicit RotaryCache(RotaryOptions options) : options_(std::move(options)) {}
  const RopeTables& get(int64_t seq_len, const torch::Device& device);
  const RotaryOptions& options() const { return options_; }

 private:
  RotaryOptions options_;
  RopeTables tables_;
  int64_t seq_len_ = -1;
  std::optional<torch::Device> device_;
};

// ---------------------------------------------------------------------------------------
// Scaled dot-product attention.

// Which implementation attention() uses. kAttentionPathAuto picks fused SDPA
// (at::scaled_dot_product_attention) where LibTorch has it (>= 2.0) and the math path
// otherwise; kAttentionPathMath forces softmax(QK^T / sqrt(HS) + mask) V written out, which
// materializes the (B, NH, T, S) score matrix; kAttentionPathSdpa requires SDPA.
enum class AttentionPath {
  kAttentionPathAuto,
  kAttentionPathMath,
  kAttentionPathSdpa,
};

// Process-wide setting (default kAttentionPathAuto), read on every attention() call.
void set_attention_path(AttentionPath path);
AttentionPath attention_path();
// Whether this LibTorch has at::scaled_dot_product_attention.
bool sdpa_available();

// Sets the attention path for a scope and puts back the previous one.
class AttentionPathGuard {
 public:
  explicit AttentionPathGuard(AttentionPath path) : previous_(attention_path()) {
    set_attention_path(path);
  }
  ~AttentionPathGuard() { set_attention_path(previous_); }
  AttentionPathGuard(const AttentionPathGuard&) = delete;
  AttentionPathGuard& operator=(const AttentionPathGuard&) = delete;

 private:
  AttentionPath previous_;
};

// softmax(q k^T / sqrt(HS) + mask) v, with grouped-query attention: k and v may have
// NKV heads, NH % NKV == 0, and query head h reads key/value head h / (NH / NKV)
// (Hugging Face's repeat_kv).
// - mask: undefined, or broadcastable to (B, NH, T, S); a bool mask is true where a query
//   may attend (SDPA's convention), a floating mask is added to the scores (0 or -inf).
// - is_causal: query t attends to keys 0..t (top-left aligned when T != S); combined with
//   `mask` when both are given.
// - dropout_p: dropout on the attention weights, only when `training` (default generator).
// q (B, NH, T, HS), k/v (B, NKV, S, HS) -> (B, NH, T, HS)
torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& mask = {}, bool is_causal = false,
                        double dropout_p = 0.0, bool training = false);

// Expands (B, NKV, S, HS) to (B, NKV * n_rep, S, HS), each head repeated n_rep times in a row.
torch::Tensor repeat_kv(const torch::Tensor& x, int64_t n_rep);

// ---------------------------------------------------------------------------------------
// Multi-head self-attention with grouped-query support and optional rotary embeddings.

struct SelfAttentionOptions {
  SelfAttentionOptions(int64_t hidden_size, int64_t num_heads)
      : hidden_size_(hidden_size), num_heads_(num_heads) {}
  TORCH_ARG(int64_t, hidden_size);       // C
  TORCH_ARG(int64_t, num_heads);         // NH
  TORCH_ARG(int64_t, num_kv_heads) = 0;  // NKV; 0 = NH (plain multi-head attention)
  TORCH_ARG(int64_t, head_size) = 0;     // HS; 0 = C / NH
  TORCH_ARG(bool, bias) = false;         // biases on q, k, v and o (Llama: none)
  TORCH_ARG(double, dropout) = 0.0;      // on the attention weights, in training only
};

class SelfAttentionImpl : public torch::nn::Cloneable<SelfAttentionImpl> {
 public:
  explicit SelfAttentionImpl(const SelfAttentionOptions& options);
  void reset() override;
  // Rotary tables are applied to q and k when defined. mask and is_causal as in attention().
  // x (B, T, C), cos/sin (T, HS) -> (B, T, C)
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos = {},
                        const torch::Tensor& sin = {}, const torch::Tensor& mask = {},
                        bool is_causal = false);

  int64_t num_kv_heads() const;
  int64_t head_size() const;

  SelfAttentionOptions options;
  torch::nn::Linear q_proj{nullptr};  // C -> NH * HS
  torch::nn::Linear k_proj{nullptr};  // C -> NKV * HS
  torch::nn::Linear v_proj{nullptr};  // C -> NKV * HS
  torch::nn::Linear o_proj{nullptr};  // NH * HS -> C
};
TORCH_MODULE(SelfAttention);

// ---------------------------------------------------------------------------------------
// SwiGLU MLP (Shazeer 2020): down(silu(gate(x)) * up(x)).

struct SwiGLUOptions {
  SwiGLUOptions(int64_t hidden_size, int64_t intermediate_size)
      : hidden_size_(hidden_size), intermediate_size_(intermediate_size) {}
  TORCH_ARG(int64_t, hidden_size);        // C
  TORCH_ARG(int64_t, intermediate_size);  // I
  TORCH_ARG(bool, bias) = false;          // Llama: none
};

class SwiGLUImpl : public torch::nn::Cloneable<SwiGLUImpl> {
 public:
  explicit SwiGLUImpl(const SwiGLUOptions& options);
  void reset() override;
  // (B, T, C) -> (B, T, C)
  torch::Tensor forward(const torch::Tensor& x);

  SwiGLUOptions options;
  torch::nn::Linear gate_proj{nullptr};  // C -> I
  torch::nn::Linear up_proj{nullptr};    // C -> I
  torch::nn::Linear down_proj{nullptr};  // I -> C
};
TORCH_MODULE(SwiGLU);

}  // namespace gradscope
