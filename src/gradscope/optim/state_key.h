// Helpers shared by gradscope's optimizers: the key of a parameter's state, and the walk of
// one step over the parameters.
#pragma once

#include <torch/torch.h>

namespace gradscope {

// The key under which torch::optim::Optimizer keeps a parameter's state: its TensorImpl's
// address, as torch::optim::serialize writes and looks it up.
inline void* param_state_key(const torch::Tensor& p) { return p.unsafeGetTensorImpl(); }

// The walk of one step that gradscope's optimizers share: `closure` (when given) run with
// gradients on and its loss returned, then `update(options, p, slot)` for every parameter
// with a gradient, in group order, where `options` is its group's (of type Options) and `slot`
// its state (empty on its first step: `update` makes it). A sparse gradient is refused, naming
// the optimizer `name`.
template <typename Options, typename Update>
torch::Tensor step_each_parameter(torch::optim::Optimizer& optimizer, const char* name,
                                  const torch::optim::Optimizer::LossClosure& closure,
                                  Update&& update) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss = {};
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : optimizer.param_groups()) {
    const auto& options = static_cast<const Options&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), name, " does not support sparse gradients");
      update(options, p, optimizer.state()[param_state_key(p)]);
    }
  }
  return loss;
}

}  // namespace gradscope
