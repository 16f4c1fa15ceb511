#include "gradscope/strategy/rng_state.h"

#include <mutex>

namespace gradscope {

torch::Tensor generator_state(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_generator_state(at::Generator generator, const torch::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

RngState RngState::capture(const torch::Device& device) {
  RngState s;
  s.cpu = generator_state(at::detail::getDefaultCPUGenerator());
  if (device.is_cuda()) {
    s.cuda_device = device;
    s.cuda = generator_state(at::globalContext().defaultGenerator(device));
  }
  return s;
}

void RngState::restore() const {
  set_generator_state(at::detail::getDefaultCPUGenerator(), cpu);
  if (cuda.defined()) set_generator_state(at::globalContext().defaultGenerator(cuda_device), cuda);
}

RngScope::RngScope(const RngState& saved, const torch::Device& device)
    : found_(RngState::capture(device)) {
  saved.restore();
}

RngScope::~RngScope() { found_.restore(); }

}  // namespace gradscope
