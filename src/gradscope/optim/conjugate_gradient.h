// Nonlinear conjugate gradient (Fletcher & Reeves 1964; Polak & Ribiere 1969; Hestenes &
// Stiefel 1952; Dai & Yuan 1999), over all parameters as one vector, one iteration per step().
// With gradient g_k at x_k (plus weight_decay * x_k, an L2 penalty) and y = g_k - g_{k-1}:
//
//   fr:  beta = g_k.g_k / g_{k-1}.g_{k-1}
//   pr+: beta = max(0, g_k.y / g_{k-1}.g_{k-1})
//   hs:  beta = g_k.y / d_{k-1}.y
//   dy:  beta = g_k.g_k / d_{k-1}.y
//
//   d_k = -g_k + beta d_{k-1},   x_{k+1} = x_k + t_k d_k
//
// The direction restarts (d_k = -g_k) at the first step, every `restart_every` steps (0: never
// on a schedule), when a denominator is 0, and whenever d_k is not a descent direction
// (g_k.d_k >= 0); restarts() counts them.
//
// The step t_k is `lr` (line_search "none": the study's stochastic setting, no closure needed),
// or found by a line search on the closure, which must re-evaluate the loss and leave the
// gradients in .grad at the current parameters (like LBFGS's). The search minimizes the
// function whose gradient CG follows: with weight decay, f(x) = loss(x) + weight_decay / 2
// ||x||^2 (the closure's loss plus the L2 term) with gradient g = grad loss + weight_decay x,
// so its conditions compare the value and the slope of one function:
//   armijo:       t = lr, lr b, lr b^2, ... (b = `backtrack`) until
//                 f(x + t d) <= f(x) + c1 t g.d;
//   strong_wolfe: Nocedal & Wright, "Numerical Optimization" (2006), Algorithms 3.5 and 3.6
//                 with cubic interpolation: f(x + t d) <= f(x) + c1 t g.d and
//                 |g(x + t d).d| <= c2 |g.d|; it starts from lr at a restart, else from
//                 t_{k-1} g_{k-1}.d_{k-1} / g_k.d_k (N&W eq. 3.60).
// A search evaluates the closure at most `max_evals` times; when no step satisfies its
// conditions it keeps the lowest loss it found (or no move at all, and the next step restarts).
// With a closure, step() evaluates it first (f and g at x_k), so a full-batch closure gives
// deterministic CG and a closure over the step's mini-batch gives the stochastic variant.
//
// State: the previous gradient and direction, two tensors the size of each parameter (2x).
#pragma once

#include <string>

#include <torch/torch.h>

#include "gradscope/optim/serializing_optimizer.h"
#include "gradscope/optim/state_bytes.h"

namespace gradscope {

struct ConjugateGradientOptions
    : public torch::optim::OptimizerCloneableOptions<ConjugateGradientOptions> {
  ConjugateGradientOptions(double lr = 1e-2) : lr_(lr) {}  // NOLINT: implicit, like LibTorch's
  TORCH_ARG(double, lr) = 1e-2;                          // the step, or a search's first trial step
  TORCH_ARG(std::string, beta_rule) = "pr+";             // fr | pr+ | hs | dy
  TORCH_ARG(std::string, line_search) = "strong_wolfe";  // none | armijo | strong_wolfe
  TORCH_ARG(int64_t, restart_every) = 0;                 // 0 = restart only when needed
  TORCH_ARG(double, c1) = 1e-4;                          // sufficient decrease, in (0, c2)
  TORCH_ARG(double, c2) = 0.1;                           // curvature (strong Wolfe), in (c1, 1)
  TORCH_ARG(double, backtrack) = 0.5;                    // Armijo's shrink factor, in (0, 1)
  TORCH_ARG(int64_t, max_evals) = 25;                    // closure evaluations per line search
  TORCH_ARG(double, tolerance_change) = 1e-12;           // smallest bracket width a search refines
  TORCH_ARG(double, weight_decay) = 0;                   // L2: in g and in a search's f

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

struct ConjugateGradientParamState
    : public torch::optim::OptimizerCloneableParamState<ConjugateGradientParamState>,
      public StateBytes {
  TORCH_ARG(int64_t, step) = 0;         // iterations done
  TORCH_ARG(torch::Tensor, prev_grad);  // g_{k-1}
  TORCH_ARG(torch::Tensor, direction);  // d_{k-1}
  // Scalars of the whole vector, the same in every parameter's state.
  TORCH_ARG(double, step_size) = 0;  // t_{k-1} (0: the last search found no decrease)
  TORCH_ARG(double, slope) = 0;      // g_{k-1}.d_{k-1}
  TORCH_ARG(int64_t, restarts) = 0;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  std::vector<torch::Tensor> state_tensors() const override { return {prev_grad_, direction_}; }
};

class ConjugateGradient
    : public SerializingOptimizer<ConjugateGradientParamState, ConjugateGradientOptions> {
 public:
  explicit ConjugateGradient(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                             ConjugateGradientOptions defaults = {});
  explicit ConjugateGradient(std::vector<torch::Tensor> params,
                             ConjugateGradientOptions defaults = {})
      : ConjugateGradient({torch::optim::OptimizerParamGroup(std::move(params))}, defaults) {}

  // Returns the loss at the parameters the step started from (the closure's first value).
  torch::Tensor step(LossClosure closure = nullptr) override;

  // Direction restarts so far (scheduled ones included).
  int64_t restarts() const;
  // Closure evaluations of the last step (the first one included).
  int64_t last_evaluations() const { return last_evaluations_; }
  // beta of the last step (0 at a restart).
  double last_beta() const { return last_beta_; }

 private:
  int64_t last_evaluations_ = 0;
  double last_beta_ = 0;
};

struct OptimizerEntry;
// The registry entry (factory.h).
OptimizerEntry cg_entry();

}  // namespace gradscope
