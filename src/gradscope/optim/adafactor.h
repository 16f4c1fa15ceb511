// Adafactor (Shazeer & Stern 2018, "Adafactor: Adaptive Learning Rates with Sublinear Memory
// Cost", arXiv:1804.04235, Algorithms 4 and 5 with Section 7's settings), following the
// widely used Hugging Face implementation. For a parameter X with gradient G at step t:
//
//   beta2_t <- 1 - t^decay_rate                                     (decay_rate = -0.8)
//   rho_t   <- min(lr, 1 / sqrt(t))  if relative_step, else lr     (min(1e-6 t, 1/sqrt(t))
//                                                                    with warmup_init)
//   alpha_t <- max(eps2, RMS(X)) * rho_t  if scale_parameter, else rho_t
//   Factored, for X of 2 or more dims (n rows, m columns over the last two dims):
//     R <- beta2_t R + (1 - beta2_t) mean_cols(G^2 + eps1)       (shape[:-1], "row")
//     C <- beta2_t C + (1 - beta2_t) mean_rows(G^2 + eps1)       (shape[:-2] + shape[-1:])
//     V <- (R / mean(R)) outer C                                  (never stored)
//   Unfactored, for 1-D X:
//     V <- beta2_t V + (1 - beta2_t) (G^2 + eps1)
//   U <- G / sqrt(V)
//   U <- U / max(1, RMS(U) / clip_threshold)                      (update clipping, d = 1)
//   U <- alpha_t U;   with beta1 set: M <- beta1 M + (1 - beta1) U, U <- M
//   X <- X - alpha_t weight_decay X - U                          (decoupled weight decay)
//
// RMS(A) = ||A||_2 / sqrt(numel A). The paper's rho_t = min(1e-2, 1/sqrt(t)); here the cap
// is the learning rate, whose registry default is that 1e-2, so --lr (and a schedule) still
// act under relative_step. State: R and C (rows + cols values) per matrix, V per vector, and
// M (1x the parameter) only with beta1.
#pragma once

#include <torch/torch.h>

#include "gradscope/optim/serializing_optimizer.h"
#include "gradscope/optim/state_bytes.h"

namespace gradscope {

struct AdafactorOptions : public torch::optim::OptimizerCloneableOptions<AdafactorOptions> {
  AdafactorOptions(double lr = 1e-2) : lr_(lr) {}  // NOLINT: implicit, like LibTorch's options
  // The step size; with relative_step, the cap of the relative step size.
  TORCH_ARG(double, lr) = 1e-2;
  TORCH_ARG(double, eps1) = 1e-30;          // added to G^2
  TORCH_ARG(double, eps2) = 1e-3;           // floor of RMS(X) in the parameter scale
  TORCH_ARG(double, clip_threshold) = 1.0;  // d: the most RMS(U) may be
  TORCH_ARG(double, decay_rate) = -0.8;     // beta2_t = 1 - t^decay_rate, in [-1, 0)
  TORCH_ARG(c10::optional<double>, beta1);  // first moment, off when unset
  TORCH_ARG(double, weight_decay) = 0;      // decoupled, scaled by alpha_t
  TORCH_ARG(bool, scale_parameter) = true;  // scale the step by RMS(X)
  TORCH_ARG(bool, relative_step) = true;    // rho_t = min(lr, 1/sqrt(t))
  TORCH_ARG(bool, warmup_init) = false;     // rho_t = min(1e-6 t, 1/sqrt(t)); needs relative_step

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

struct AdafactorParamState : public torch::optim::OptimizerCloneableParamState<AdafactorParamState>,
                             public StateBytes {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, exp_avg_sq_row);  // R, shape[:-1]               (factored)
  TORCH_ARG(torch::Tensor, exp_avg_sq_col);  // C, shape[:-2] + shape[-1:]  (factored)
  TORCH_ARG(torch::Tensor, exp_avg_sq);      // V, the parameter's shape    (unfactored)
  TORCH_ARG(torch::Tensor, exp_avg);         // M, the parameter's shape    (with beta1)

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  std::vector<torch::Tensor> state_tensors() const override {
    return {exp_avg_sq_row_, exp_avg_sq_col_, exp_avg_sq_, exp_avg_};
  }
};

class Adafactor : public SerializingOptimizer<AdafactorParamState, AdafactorOptions> {
 public:
  explicit Adafactor(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                     AdafactorOptions defaults = {});
  explicit Adafactor(std::vector<torch::Tensor> params, AdafactorOptions defaults = {})
      : Adafactor({torch::optim::OptimizerParamGroup(std::move(params))}, defaults) {}

  torch::Tensor step(LossClosure closure = nullptr) override;
};

struct OptimizerEntry;
// The registry entry (factory.h).
OptimizerEntry adafactor_entry();

}  // namespace gradscope
