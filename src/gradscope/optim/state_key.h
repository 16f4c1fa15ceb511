// Helpers shared by gradscope's optimizers.
#pragma once

#include <torch/torch.h>

namespace gradscope {

// The key under which torch::optim::Optimizer keeps a parameter's state: its TensorImpl's
// address, as torch::optim::serialize writes and looks it up.
inline void* param_state_key(const torch::Tensor& p) { return p.unsafeGetTensorImpl(); }

}  // namespace gradscope
