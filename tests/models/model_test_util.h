// Helpers shared by the model tests.
#pragma once

#include <cstdint>

#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "gradscope/models/llama.h"
#include "gradscope/models/modernbert.h"
#include "gradscope/models/nanovlm.h"
#include "gradscope/models/vit.h"

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

// The model's output on a fixed input, in evaluation mode (no dropout).
inline torch::Tensor model_output(const std::string& model, Model& m, const nlohmann::json& arch) {
  m.eval();
  torch::NoGradGuard no_grad;
  if (model == "llama")
    return dynamic_cast<LlamaModel&>(m).logits(
        random_ids(2, 9, arch["vocab_size"].get<int64_t>(), 3));
  if (model == "modernbert") {
    auto& bert = dynamic_cast<ModernBertModel&>(m);
    auto hidden = bert.encode(random_ids(2, 20, arch["vocab_size"].get<int64_t>(), 3));
    return bert.mlm_logits(hidden.reshape({-1, hidden.size(-1)}));
  }
  const int64_t side = arch["image_size"].get<int64_t>();
  const auto images = random_normal({2, 3, side, side}, 4);
  if (model == "vit") return dynamic_cast<ViTModel&>(m).logits(images);
  return dynamic_cast<NanoVlmModel&>(m).logits(
      images, random_ids(2, 7, arch["vocab_size"].get<int64_t>(), 3));
}

}  // namespace gradscope::testing
