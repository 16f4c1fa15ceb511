// Bytes of tensor storage, each storage counted once: what a set of tensors keeps alive.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

namespace gradscope {

// Bytes of the storages behind the defined tensors, each storage counted once: views and
// tensors sharing memory are not counted twice, and a view counts its whole storage, since
// that is the memory it keeps alive.
int64_t tensors_bytes(const std::vector<torch::Tensor>& tensors);
// tensors_bytes of the parameters' defined gradients.
int64_t grads_bytes(const std::vector<torch::Tensor>& params);

}  // namespace gradscope
