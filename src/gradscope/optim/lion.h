// Lion, "EvoLved Sign Momentum" (Chen et al. 2023, "Symbolic Discovery of Optimization
// Algorithms", arXiv:2302.06675, Algorithm 2). For each parameter x with gradient g and
// momentum m (zero at the start):
//
//   c <- beta1 * m + (1 - beta1) * g          (interpolation used for the update only)
//   x <- x - lr * (sign(c) + weight_decay * x)    (decoupled weight decay, as in AdamW)
//   m <- beta2 * m + (1 - beta2) * g
//
// Every coordinate moves by exactly lr (plus decay), so the paper uses a learning rate 3-10x
// smaller than AdamW's and a weight decay 3-10x larger. sign(0) = 0.
// State: one momentum tensor the size of each parameter (1x the parameters' bytes).
#pragma once

#include <tuple>

#include <torch/torch.h>

#include "gradscope/optim/serializing_optimizer.h"
#include "gradscope/optim/state_bytes.h"

namespace gradscope {

struct LionOptions : public torch::optim::OptimizerCloneableOptions<LionOptions> {
  LionOptions(double lr = 1e-4) : lr_(lr) {}  // NOLINT: implicit, like LibTorch's options
  typedef std::tuple<double, double> betas_t;
  TORCH_ARG(double, lr) = 1e-4;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.99);  // (update, momentum), in [0, 1)
  TORCH_ARG(double, weight_decay) = 0;                     // decoupled, scaled by lr

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

struct LionParamState : public torch::optim::OptimizerCloneableParamState<LionParamState>,
                        public StateBytes {
  TORCH_ARG(torch::Tensor, exp_avg);  // m

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  std::vector<torch::Tensor> state_tensors() const override { return {exp_avg_}; }
};

class Lion : public SerializingOptimizer<LionParamState, LionOptions> {
 public:
  explicit Lion(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                LionOptions defaults = {});
  explicit Lion(std::vector<torch::Tensor> params, LionOptions defaults = {})
      : Lion({torch::optim::OptimizerParamGroup(std::move(params))}, defaults) {}

  torch::Tensor step(LossClosure closure = nullptr) override;
};

struct OptimizerEntry;
// The registry entry (factory.h).
OptimizerEntry lion_entry();

}  // namespace gradscope
