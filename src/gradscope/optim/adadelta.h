// Adadelta (Zeiler 2012, "ADADELTA: An Adaptive Learning Rate Method", arXiv:1212.5701),
// with exactly torch.optim.Adadelta's semantics. For each parameter x with gradient g:
//
//   g   <- -g                            if maximize
//   g   <- g + weight_decay * x          (L2 penalty, coupled)
//   E[g^2]  <- rho * E[g^2] + (1 - rho) * g^2                         (square_avg)
//   dx      <- sqrt(E[dx^2] + eps) / sqrt(E[g^2] + eps) * g
//   E[dx^2] <- rho * E[dx^2] + (1 - rho) * dx^2                       (acc_delta)
//   x   <- x - lr * dx
//
// The paper has no learning rate (lr = 1, PyTorch's default); eps sits inside both roots.
// State: two tensors the size of each parameter (2x the parameters' bytes).
#pragma once

#include <torch/torch.h>

#include "gradscope/optim/serializing_optimizer.h"
#include "gradscope/optim/state_bytes.h"

namespace gradscope {

struct AdadeltaOptions : public torch::optim::OptimizerCloneableOptions<AdadeltaOptions> {
  AdadeltaOptions(double lr = 1.0) : lr_(lr) {}  // NOLINT: implicit, like LibTorch's options
  TORCH_ARG(double, lr) = 1.0;
  TORCH_ARG(double, rho) = 0.9;  // decay of both running averages, in [0, 1]
  TORCH_ARG(double, eps) = 1e-6;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, maximize) = false;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

struct AdadeltaParamState : public torch::optim::OptimizerCloneableParamState<AdadeltaParamState>,
                            public StateBytes {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, square_avg);  // E[g^2]
  TORCH_ARG(torch::Tensor, acc_delta);   // E[dx^2]

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  std::vector<torch::Tensor> state_tensors() const override { return {square_avg_, acc_delta_}; }
};

class Adadelta : public SerializingOptimizer<AdadeltaParamState, AdadeltaOptions> {
 public:
  explicit Adadelta(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                    AdadeltaOptions defaults = {});
  explicit Adadelta(std::vector<torch::Tensor> params, AdadeltaOptions defaults = {})
      : Adadelta({torch::optim::OptimizerParamGroup(std::move(params))}, defaults) {}

  torch::Tensor step(LossClosure closure = nullptr) override;
};

struct OptimizerEntry;
// The registry entry (factory.h).
OptimizerEntry adadelta_entry();

}  // namespace gradscope
