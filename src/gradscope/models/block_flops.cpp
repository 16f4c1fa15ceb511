#include "gradscope/models/block_flops.h"

#include "gradscope/models/llama.h"
#include "gradscope/models/modernbert.h"
#include "gradscope/models/nanovlm.h"
#include "gradscope/models/vit.h"

namespace gradscope {
namespace {

// A decoder block of Llama (and NanoVLM's decoder) over T positions, as
// llama_forward_flops_per_token counts it.
BlockFlops decoder_block_flops(const LlamaConfig& c, int64_t tokens, const char* tower) {
  const double C = static_cast<double>(c.hidden_size), T = static_cast<double>(tokens);
  const double q = static_cast<double>(c.num_attention_heads * c.head_dim);
  const double kv = static_cast<double>(c.num_key_value_heads * c.head_dim);
  const double I = static_cast<double>(c.intermediate_size);
  BlockFlops b;
  b.tower = tower;
  b.attention = 2.0 * T * (C * q + 2 * C * kv + q * C) + 2.0 * 2.0 * T * T * q;
  b.mlp = 2.0 * T * 3 * C * I;  // gate, up, down
  return b;
}

// An encoder block of ViT (and NanoVLM's vision tower), as vision_forward_flops_per_image
// counts it.
BlockFlops encoder_block_flops(const VisionConfig& c, const char* tower) {
  const double C = static_cast<double>(c.hidden_size), I = static_cast<double>(c.intermediate_size);
  const double T = static_cast<double>(c.num_tokens());
  BlockFlops b;
  b.tower = tower;
  b.attention = 2.0 * T * 4 * C * C + 2.0 * 2.0 * T * T * C;  // q, k, v, o; scores, sum
  b.mlp = 2.0 * T * 2 * C * I;                                // fc1, fc2
  return b;
}

}  // namespace

std::vector<BlockFlops> llama_block_flops(const nlohmann::json& arch, int64_t seq_len) {
  const LlamaConfig c = llama_config(arch);
  return std::vector<BlockFlops>(static_cast<size_t>(c.num_hidden_layers),
                                 decoder_block_flops(c, seq_len, "decoder"));
}

std::vector<BlockFlops> vit_block_flops(const nlohmann::json& arch, int64_t /*seq_len*/) {
  const VisionConfig c = vision_config(arch, "vit");
  return std::vector<BlockFlops>(static_cast<size_t>(c.num_hidden_layers),
                                 encoder_block_flops(c, "encoder"));
}

// As modernbert_forward_flops_per_token: attention over the full T x T matrix, which the
// kernels compute whatever the sliding window keeps; GeGLU's Wi maps C -> 2I.
std::vector<BlockFlops> modernbert_block_flops(const nlohmann::json& arch, int64_t seq_len) {
  const ModernBertConfig c = modernbert_config(arch);
  const double C = static_cast<double>(c.hidden_size), I = static_cast<double>(c.intermediate_size);
  const double T = static_cast<double>(seq_len);
  BlockFlops b;
  b.tower = "encoder";
  b.attention = 2.0 * T * 4 * C * C + 2.0 * 2.0 * T * T * C;
  b.mlp = 2.0 * T * 3 * C * I;
  return std::vector<BlockFlops>(static_cast<size_t>(c.num_hidden_layers), b);
}

// The decoder runs over the image tokens and the caption.
std::vector<BlockFlops> nanovlm_block_flops(const nlohmann::json& arch, int64_t seq_len) {
  const NanoVlmConfig c = nanovlm_config(arch);
  std::vector<BlockFlops> blocks(static_cast<size_t>(c.vision.num_hidden_layers),
                                 encoder_block_flops(c.vision, "vision"));
  const BlockFlops d = decoder_block_flops(c.decoder, c.image_tokens() + seq_len, "decoder");
  blocks.insert(blocks.end(), static_cast<size_t>(c.decoder.num_hidden_layers), d);
  return blocks;
}

}  // namespace gradscope
