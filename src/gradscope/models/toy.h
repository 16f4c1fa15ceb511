// Toy problems with known minima, as models, so that an optimizer can be checked where the
// answer is known. The parameters are one point x (float64, so that convergence can be
// measured to 1e-8); the loss is f(x), the same for every batch (full batch, deterministic).
//
//   quadratic:  f(x) = 1/2 (x - x*)^T A (x - x*),  A = Q diag(lambda) Q^T,
//               lambda log-spaced from 1 to `condition`, Q a random orthogonal matrix and x*
//               a standard normal point, both drawn from `problem_seed`; starts at x = 0.
//               Minimum 0 at x*.
//   rosenbrock: f(x) = sum_{i<n} 100 (x_{i+1} - x_i^2)^2 + (1 - x_i)^2 (Rosenbrock 1960, the
//               n-dimensional form), starts at (-1.2, 1, -1.2, 1, ...). Minimum 0 at (1, .., 1).
//
// Architecture keys: "dim" (n), "condition" and "problem_seed" (quadratic), "seq_len" (1: a
// batch is one evaluation of f). The run's --seed changes nothing: the problem and its start
// are fixed by the architecture.
#pragma once

#include <cstdint>
#include <memory>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "gradscope/models/model.h"

namespace gradscope {

class ToyModel : public Model {
 public:
  // The loss at the point (a batch carries nothing the problem needs), target count 1.
  LossOutput loss(const Batch& batch) override;
  std::vector<std::shared_ptr<Block>> blocks() override { return {}; }

  const torch::Tensor& point() const { return x_; }  // (n) float64
  virtual torch::Tensor minimizer() const = 0;       // (n) float64
  double min_loss() const { return 0.0; }

 protected:
  virtual torch::Tensor value(const torch::Tensor& x) = 0;  // () float64
  torch::Tensor x_;
};

nlohmann::json quadratic_preset(const std::string& preset);
int64_t toy_count_params(const nlohmann::json& arch);
std::shared_ptr<Model> make_quadratic(const nlohmann::json& arch, uint64_t seed);
double quadratic_forward_flops(const nlohmann::json& arch, int64_t seq_len);

nlohmann::json rosenbrock_preset(const std::string& preset);
std::shared_ptr<Model> make_rosenbrock(const nlohmann::json& arch, uint64_t seed);
double rosenbrock_forward_flops(const nlohmann::json& arch, int64_t seq_len);

}  // namespace gradscope
