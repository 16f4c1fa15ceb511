// Helpers shared by the model tests.
#pragma once

#include <cstdint>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

namespace gradscope::testing {

inline int64_t module_param_count(torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += p.numel();
  return n;
}

// Token ids in [0, high) from a seeded generator, independent of the default one.
inline torch::Tensor random_ids(int64_t b, int64_t t, int64_t high, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return torch::randint(high, {b, t}, gen, torch::kLong);
}

// Standard-normal values of the given shape from a seeded generator.
inline torch::Tensor random_normal(at::IntArrayRef shape, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return torch::randn(shape, gen);
}

inline double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

}  // namespace gradscope::testing
