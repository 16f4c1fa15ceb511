// Transformer building blocks shared by the models: RMSNorm and LayerNorm (with or without
// bias), rotary position embeddings (with Llama 3 frequency scaling), attention masks,
// scaled dot-product attention with grouped-query support, a self-attention module, the
// SwiGLU, GELU and GeGLU MLPs, the patch embedding of vision transformers, and the weight
// initialisation the models share. Parameter names follow Hugging Face
// (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, weight) so that weights
// map one to one.
//
// Dimension legend: B batch, T query positions, S key positions (S == T in self-attention),
// C hidden size, NH query heads, NKV key/value heads, HS head size, I MLP intermediate size.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "gradscope/core/config.h"

namespace gradscope {

// ---------------------------------------------------------------------------------------
// LayerNorm (Ba et al. 2016): (x - mean) / sqrt(var + eps) * weight (+ bias), the bias
// optional (ModernBERT has none), under Hugging Face's parameter names.

struct LayerNormOptions {
  /* implicit */ LayerNormOptions(int64_t dim) : dim_(dim) {}
  TORCH_ARG(int64_t, dim);
  TORCH_ARG(double, eps) = 1e-5;
  TORCH_ARG(bool, bias) = true;
};

class LayerNormImpl : public torch::nn::Cloneable<LayerNormImpl> {
 public:
  explicit LayerNormImpl(const LayerNormOptions& options);
  void reset() override;
  void reset_parameters();  // weight = 1, bias = 0
  // (..., C) -> (..., C)
  torch::Tensor forward(const torch::Tensor& x);

  LayerNormOptions options;
  torch::Tensor weight;  // (C)
  torch::Tensor bias;    // (C), undefined without bias
};
TORCH_MODULE(LayerNorm);

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
// Dropout in training: each element of x is zeroed with probability p, the rest scaled by
// 1 / (1 - p); autograd saves a bool mask (one byte an element). On the CPU the mask's bits are
// SplitMix64 of a counter, seeded by one 64-bit draw from the default CPU generator: a
// recompute under the same generator state draws the same mask, and the number of threads
// does not change it. Forward and backward are one pass each (ATen's CPU dropout draws a
// double per element from the Mersenne Twister and keeps a float mask). On other devices it
// is ATen's fused dropout. p = 0 returns x itself.
torch::Tensor dropout(const torch::Tensor& x, double p);
// The CPU mask of elements [begin, end): keep[i] is whether element i's 32 bits (the low or
// high half of SplitMix64(seed, pair i / 2)) are below `threshold`, whatever range a thread
// is given.
void dropout_keep_mask(uint64_t seed, uint32_t threshold, bool* keep, int64_t begin,
                       int64_t end);

// ---------------------------------------------------------------------------------------
// Attention masks, as bool tensors that are true where a query may attend a key (SDPA's
// convention). A model builds the masks of a batch once, before its blocks, and passes them
// to every layer in its BlockContext.

// Query t may attend keys 0..t. (T, T)
torch::Tensor causal_mask(int64_t t, const torch::Device& device = torch::kCPU);
// Query i may attend key j when |i - j| <= half_window (ModernBERT's local layers: a window
// of 128 is 64 on each side). (T, T)
torch::Tensor sliding_window_mask(int64_t t, int64_t half_window,
                                  const torch::Device& device = torch::kCPU);
// From (B, S) bool, true at real (not padding) positions, to (B, 1, 1, S): no query attends a
// padding key.
torch::Tensor key_padding_mask(const torch::Tensor& real_positions);

// ---------------------------------------------------------------------------------------
// Scaled dot-product attention.

// Which implementation attention() uses (--attention; core/config.h says what each does).
// Process-wide (default auto), read on every attention() call; a session sets it for its run.
void set_attention_path(Attention path);
Attention attention_path();
// What an attention() call with dropout probability `dropout_p` (as applied: 0 outside
// training) on `device` runs under `path`: sdpa or math, never auto.
Attention resolved_attention(Attention path, const torch::Device& device, double dropout_p);

// Sets the attention path for a scope and puts back the previous one.
class AttentionPathGuard {
 public:
  explicit AttentionPathGuard(Attention path) : previous_(attention_path()) {
    set_attention_path(path);
  }
  ~AttentionPathGuard() { set_attention_path(previous_); }
  AttentionPathGuard(const AttentionPathGuard&) = delete;
  AttentionPathGuard& operator=(const AttentionPathGuard&) = delete;

 private:
  Attention previous_;
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
// Packed projections (--projections packed): linear layers that read the same input computed
// as one product, F::linear(x, cat(weights), cat(biases)), split into one view per layer
// (split_with_sizes along the last dimension). The layers keep their own parameters; autograd
// splits the stacked weight's gradient back into each one's. The stacked weight is copied at
// every call and saved for backward. All layers have biases, or none.
// x (..., in) -> one (..., out_i) view per layer
std::vector<torch::Tensor> packed_linear(
    const torch::Tensor& x,
    std::initializer_list<std::reference_wrapper<torch::nn::LinearImpl>> layers);

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
  // --projections packed: q, k and v as one matrix product over their stacked weights.
  void set_packed(bool packed) { packed_ = packed; }
  bool packed() const { return packed_; }

  SelfAttentionOptions options;
  torch::nn::Linear q_proj{nullptr};  // C -> NH * HS
  torch::nn::Linear k_proj{nullptr};  // C -> NKV * HS
  torch::nn::Linear v_proj{nullptr};  // C -> NKV * HS
  torch::nn::Linear o_proj{nullptr};  // NH * HS -> C

 private:
  bool packed_ = false;
};
TORCH_MODULE(SelfAttention);

// The head size of every attention's query, key and value projection parameters under `root`
// (their weights and biases, named as root.named_parameters() names them), for optimizers
// that partition those rows by head.
std::map<std::string, int64_t> attention_head_sizes(const torch::nn::Module& root);

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
  // --projections packed: gate and up as one matrix product over their stacked weights.
  void set_packed(bool packed) { packed_ = packed; }
  bool packed() const { return packed_; }

  SwiGLUOptions options;
  torch::nn::Linear gate_proj{nullptr};  // C -> I
  torch::nn::Linear up_proj{nullptr};    // C -> I
  torch::nn::Linear down_proj{nullptr};  // I -> C

 private:
  bool packed_ = false;
};
TORCH_MODULE(SwiGLU);

// ---------------------------------------------------------------------------------------
// GELU MLP of ViT and SigLIP: fc2(gelu(fc1(x))), as transformers writes both (ViT's dropout
// is on the residual branch, the block's). The options are GeGLU's too.

struct GeluMLPOptions {
  GeluMLPOptions(int64_t hidden_size, int64_t intermediate_size)
      : hidden_size_(hidden_size), intermediate_size_(intermediate_size) {}
  TORCH_ARG(int64_t, hidden_size);        // C
  TORCH_ARG(int64_t, intermediate_size);  // I
  TORCH_ARG(bool, bias) = true;
  TORCH_ARG(bool, tanh_approximation) = false;  // SigLIP's gelu_pytorch_tanh
  TORCH_ARG(double, dropout) = 0.0;             // GeGLU's, before Wo, in training only
};

class GeluMLPImpl : public torch::nn::Cloneable<GeluMLPImpl> {
 public:
  explicit GeluMLPImpl(const GeluMLPOptions& options);
  void reset() override;
  // (B, T, C) -> (B, T, C)
  torch::Tensor forward(const torch::Tensor& x);

  GeluMLPOptions options;
  torch::nn::Linear fc1{nullptr};  // C -> I
  torch::nn::Linear fc2{nullptr};  // I -> C
};
TORCH_MODULE(GeluMLP);

// ---------------------------------------------------------------------------------------
// GeGLU MLP (Shazeer 2020) as ModernBERT writes it: one input projection Wi to 2I, split
// into (input, gate), then Wo(dropout(gelu(input) * gate)).

class GeGLUImpl : public torch::nn::Cloneable<GeGLUImpl> {
 public:
  // `options.intermediate_size()` is I, the width after the split (ModernBERT-base: 1152).
  explicit GeGLUImpl(const GeluMLPOptions& options);
  void reset() override;
  // (B, T, C) -> (B, T, C)
  torch::Tensor forward(const torch::Tensor& x);

  GeluMLPOptions options;
  torch::nn::Linear Wi{nullptr};  // C -> 2I
  torch::nn::Linear Wo{nullptr};  // I -> C
};
TORCH_MODULE(GeGLU);

// ---------------------------------------------------------------------------------------
// Patch embedding of vision transformers (Dosovitskiy et al. 2021): a convolution with
// kernel = stride = patch size, so each non-overlapping patch becomes one token.

class PatchEmbeddingImpl : public torch::nn::Cloneable<PatchEmbeddingImpl> {
 public:
  PatchEmbeddingImpl(int64_t channels, int64_t hidden_size, int64_t patch_size);
  void reset() override;
  // (B, channels, H, W) -> (B, (H / P) * (W / P), C), patches in row-major order
  torch::Tensor forward(const torch::Tensor& images);

  int64_t channels, hidden_size, patch_size;
  torch::nn::Conv2d projection{nullptr};
};
TORCH_MODULE(PatchEmbedding);

// ---------------------------------------------------------------------------------------
// Initialisation shared by the models (Hugging Face's _init_weights): normal(0, std) for the
// weights of linear, convolution and embedding layers, zeros for their biases, ones and zeros
// for norms. Draws in module registration order from `gen` (a CPU generator seeded from the
// run seed, never the default one), in float32 on the CPU whatever the parameter's device and
// dtype, so that a seed means the same weights everywhere. Parameters registered directly on
// a model (class tokens, position tables) are the caller's, drawn with normal_init after.
void init_weights_normal(torch::nn::Module& root, double std, at::Generator& gen);
void normal_init(torch::Tensor& weight, double std, at::Generator& gen);

}  // namespace gradscope
