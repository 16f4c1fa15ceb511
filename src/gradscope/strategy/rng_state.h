// The states of the generators dropout draws from, captured and put back. Checkpointing
// (checkpoint.cpp) sets them for a recompute, so that it draws the forward's masks; a line
// search (updater.cpp) sets them before each evaluation, so that every evaluation of one step
// sees the same function.
#pragma once

#include <torch/torch.h>

namespace gradscope {

// The state of `generator`, read under its lock.
torch::Tensor generator_state(at::Generator generator);
// Sets `generator` to `state`, under its lock.
void set_generator_state(at::Generator generator, const torch::Tensor& state);

// The states of the generators dropout on `device` can draw from: the default CPU generator
// always, and the default generator of `device` when it is a CUDA device.
// at::globalContext().defaultGenerator exists in CPU-only builds too; it is only reached for a
// CUDA device, which such a build cannot have.
struct RngState {
  torch::Tensor cpu;
  torch::Tensor cuda;  // undefined unless captured for a CUDA device
  torch::Device cuda_device = torch::kCPU;

  static RngState capture(const torch::Device& device);
  // Sets the generators to the captured states.
  void restore() const;
};

// Sets the generators to `saved` for its lifetime, then puts back the states it found.
class RngScope {
 public:
  RngScope(const RngState& saved, const torch::Device& device);
  ~RngScope();
  RngScope(const RngScope&) = delete;
  RngScope& operator=(const RngScope&) = delete;

 private:
  RngState found_;
};

}  // namespace gradscope
