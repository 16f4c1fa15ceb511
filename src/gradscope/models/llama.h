// Llama 3 decoder (Grattafiori et al. 2024, "The Llama 3 Herd of Models"; the paper preset is
// Llama 3.2 1B): token embedding, L pre-norm blocks
//   h = x + attn(rmsnorm(x))        grouped-query attention, RoPE with llama3 scaling, causal
//   y = h + swiglu(rmsnorm(h))
// a final RMSNorm and an LM head tied to the embedding (one weight, used twice).
// Parameter names are Hugging Face's without the "model." prefix (embed_tokens,
// layers.N.self_attn.q_proj, layers.N.mlp.gate_proj, layers.N.input_layernorm, norm, lm_head).
//
// The architecture is a JSON object with Hugging Face's LlamaConfig names:
//   hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size
//     (required);
//   num_key_value_heads (default num_attention_heads), head_dim (default hidden_size /
//   num_attention_heads), rms_norm_eps (1e-6), rope_theta (10000), rope_scaling (null, or
//   {rope_type "llama3", factor, low_freq_factor, high_freq_factor,
//   original_max_position_embeddings}), tie_word_embeddings (false), attention_bias (false),
//   mlp_bias (false), attention_dropout (0), initializer_range (0.02);
// plus hidden_dropout (0; not in Llama: dropout on each residual branch, as GPT-2's
// resid_pdrop, so that --dropout reaches the whole block) and gradscope's "tokenizer",
// "seq_len" and "dataset", which the model itself does not read.
//
// Dimension legend: B batch, T sequence positions, C hidden size, V vocabulary,
// NH query heads, NKV key/value heads, HS head size, I intermediate size, L layers.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "gradscope/models/common/layers.h"
#include "gradscope/models/common/memory_trace.h"
#include "gradscope/models/model.h"

namespace gradscope {

// The architecture, parsed and validated.
struct LlamaConfig {
  int64_t vocab_size = 0;           // V
  int64_t hidden_size = 0;          // C
  int64_t num_hidden_layers = 0;    // L
  int64_t num_attention_heads = 0;  // NH
  int64_t num_key_value_heads = 0;  // NKV, divides NH
  int64_t head_dim = 0;             // HS
  int64_t intermediate_size = 0;    // I
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<Llama3RopeScaling> rope_scaling;  // rope_type "llama3" only
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  double attention_dropout = 0.0;
  double hidden_dropout = 0.0;
  double initializer_range = 0.02;  // std of the normal initialisation
};

// Parses and checks `arch`; a missing or bad value is a usage error naming the key.
LlamaConfig llama_config(const nlohmann::json& arch);

// The memory trace of one training step at micro-batch `batch` (memory_trace.h).
void llama_trace_step(const nlohmann::json& arch, int64_t batch, MemoryTrace& trace);
// The decoder blocks of a trace over `tokens` positions, from hidden states x; mask_bytes is
// the size of a bool mask the batch brings (0: the causal mask built per layer).
// The final norm, LM head (tied to the embedding table `embedding` if the config says so)
// and cross-entropy over `rows` positions of x; releases x.
void trace_llama_head(const LlamaConfig& c, MemoryTrace::Id x, int64_t rows, int embedding,
                      MemoryTrace& trace);
MemoryTrace::Id trace_llama_blocks(const LlamaConfig& c, int64_t batch, int64_t tokens,
                                   MemoryTrace::Id x, int64_t mask_bytes, MemoryTrace& trace);

// Presets "tiny", "small", "paper" (docs/usage.md, "Models"); any other name is a
// usage error listing them.
nlohmann::json llama_preset(const std::string& preset);

// Parameters of the architecture, counted without building it.
int64_t llama_count_params(const nlohmann::json& arch);

// Forward FLOPs per token at sequence length seq_len. Convention (as in the Chinchilla and
// PaLM appendices): a multiply-add is 2 FLOPs; counted are the matmuls, i.e.
//   2 * (weights of q, k, v, o, gate, up, down in every layer + the LM head's V * C)
// (the LM head counts even when tied: the matrix is used twice, the embedding lookup is
// a gather), plus the attention scores q k^T and the weighted sum of v,
//   2 * 2 * seq_len * NH * HS per layer,
// over the full T x T matrix as the kernels compute it (no halving for the causal mask).
// Norms, softmax, activations, rotary embeddings and biases are left out (< 1%).
// Training is about 3x this (backward = 2x forward); the caller applies that.
double llama_forward_flops_per_token(const nlohmann::json& arch, int64_t seq_len);

// One decoder layer.
class LlamaBlock : public Block {
 public:
  explicit LlamaBlock(const LlamaConfig& config);
  // Causal self-attention; ctx.rope_cos/rope_sin are the (T, HS) rotary tables, ctx.mask
  // (optional) is combined with the causal mask.
  // (B, T, C) -> (B, T, C)
  torch::Tensor forward(const torch::Tensor& x, const BlockContext& ctx) override;
  bool exposes_sublayers() const override { return true; }

  RMSNorm input_layernorm{nullptr};
  SelfAttention self_attn{nullptr};
  RMSNorm post_attention_layernorm{nullptr};
  SwiGLU mlp{nullptr};

 private:
  double hidden_dropout_ = 0.0;
};

class LlamaModel : public Model {
 public:
  // Allocates the weights uninitialised (the caller runs init_weights, or loads them).
  explicit LlamaModel(const LlamaConfig& config);

  // Hugging Face's initialisation: normal(0, initializer_range) for linear and embedding
  // weights, zeros for biases, ones for norms, drawn in module order from a CPU generator
  // seeded with `seed` (never the default generator), so one seed gives one set of weights.
  void init_weights(uint64_t seed);

  // Summed cross-entropy over targets != kIgnoreIndex, and their count; with
  // loss_options().chunked, over chunks of positions (chunked_lm_loss).
  LossOutput loss(const Batch& batch) override;
  std::vector<std::shared_ptr<Block>> blocks() override;
  bool has_lm_head() const override { return true; }

  // (B, T) int64 -> (B, T, V)
  torch::Tensor logits(const torch::Tensor& input_ids);
  // The pieces of logits(), for models that put other embeddings in front of the text
  // (a vision-language model's image tokens).
  // (B, T) int64 -> (B, T, C)
  torch::Tensor embed(const torch::Tensor& input_ids);
  // Blocks (through the block runner) and the final norm; positions start at 0.
  // (B, T, C) -> (B, T, C)
  torch::Tensor decode(const torch::Tensor& inputs_embeds);
  // (B, T, C) -> (B, T, V)
  torch::Tensor lm_logits(const torch::Tensor& hidden);
  // The summed cross-entropy of lm_logits(hidden) against targets != kIgnoreIndex, taken
  // chunk_rows positions at a time without the logits of all of them (common/lm_loss.h).
  // (B, T, C), (B, T) int64 -> ()
  torch::Tensor chunked_lm_loss(const torch::Tensor& hidden, const torch::Tensor& targets,
                                int64_t chunk_rows);
  // What every block of a forward over `seq_len` positions gets: the rotary tables.
  BlockContext context(int64_t seq_len, const torch::Device& device);

  const LlamaConfig& config() const { return config_; }

  torch::nn::Embedding embed_tokens{nullptr};  // (V, C)
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
  torch::nn::Linear lm_head{nullptr};  // (V, C); null when tied to embed_tokens

 private:
  LlamaConfig config_;
  std::vector<std::shared_ptr<LlamaBlock>> blocks_;
  RotaryCache rope_;
};

// Builds a Llama with weights initialised from `seed`.
std::shared_ptr<Model> make_llama(const nlohmann::json& arch, uint64_t seed);

}  // namespace gradscope
