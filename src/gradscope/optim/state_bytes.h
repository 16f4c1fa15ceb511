// What an optimizer's state takes: the bytes of every tensor it keeps (momentum, moments,
// accumulators, projections), shared storage counted once.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

namespace gradscope {

// Implemented by optimizer parameter states (and optimizers) that gradscope adds, so that
// optimizer_state_bytes can count them without knowing their type. An optimizer that holds
// state outside its per-parameter states (projection matrices, a search direction)
// implements it on the optimizer itself; its answer is then taken as the whole total.
class StateBytes {
 public:
  virtual ~StateBytes() = default;
  // The tensors this state holds (undefined ones are skipped by the caller).
  virtual std::vector<torch::Tensor> state_tensors() const = 0;
};

// Bytes of every tensor in the optimizer's state, shared storage counted once. LibTorch's
// own param states (SGD, Adam, AdamW, Adagrad, RMSprop, LBFGS) are recognised by type,
// since they have no common accessor for their tensors (serializing them would copy every
// byte); states of any other type must implement StateBytes, and a state that does neither
// throws a runtime error naming the gap rather than being counted as 0.
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);
// The tensors counted by optimizer_state_bytes (undefined ones left out), found the same way.
std::vector<torch::Tensor> optimizer_state_tensors(const torch::optim::Optimizer& optimizer);

}  // namespace gradscope
