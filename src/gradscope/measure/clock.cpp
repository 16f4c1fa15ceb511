#include "gradscope/measure/clock.h"

#include <chrono>

namespace gradscope {

double SteadyClock::now_s() const {
  const auto since_origin = std::chrono::steady_clock::now().time_since_epoch();
  return std::chrono::duration<double>(since_origin).count();
}

void sync(const torch::Device& device) {
  // torch::cuda::synchronize is in every LibTorch, CPU-only builds included (where it throws),
  // so no build guard is needed; CUDA devices are refused earlier on a
  // build without CUDA.
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : -1);
}

}  // namespace gradscope
