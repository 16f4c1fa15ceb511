// The forward FLOPs of a model's blocks, split as checkpointing splits a block, for
// `gradscope estimate`'s count of what a checkpoint recomputes. Each model family's registry
// entry points at its function (registry.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gradscope {

// The forward FLOPs of one block of model.blocks() for one sample: the attention sub-layer
// (q, k, v, o and the attention products) and the MLP sub-layer, as the model's analytical
// count (forward_flops_per_token) has them.
struct BlockFlops {
  std::string tower;  // "decoder", "encoder" or "vision"
  double attention = 0;
  double mlp = 0;
};

// Every block of each model, in the order of model.blocks(), at sequence length `seq_len`.
std::vector<BlockFlops> llama_block_flops(const nlohmann::json& arch, int64_t seq_len);
std::vector<BlockFlops> vit_block_flops(const nlohmann::json& arch, int64_t seq_len);
std::vector<BlockFlops> modernbert_block_flops(const nlohmann::json& arch, int64_t seq_len);
// The vision tower's blocks, then the decoder's.
std::vector<BlockFlops> nanovlm_block_flops(const nlohmann::json& arch, int64_t seq_len);

}  // namespace gradscope
