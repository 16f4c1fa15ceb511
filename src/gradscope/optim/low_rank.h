// What GaLore and APOLLO share: the side a matrix's projection takes, and Adam's moments in
// the projected shape, their checks of rank and names (galore.h, apollo.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "gradscope/core/error.h"

namespace gradscope {

// Whether an (m, n) matrix is projected on the left (P (m, r), R = P^T G of shape (r, n)),
// else on the right (R of shape (m, r)): on its shorter side, and a square matrix on the right,
// as both papers' projectors decide (`shape[0] >= shape[1]`: right).
inline bool projects_on_left(int64_t m, int64_t n) { return m < n; }

// GaLore and APOLLO pick the matrices they project by name: without the parameters' names
// they refuse to be built (a runtime error naming the optimizer).
inline void require_param_names(const std::string& optimizer,
                                const std::vector<std::string>& names,
                                const std::vector<torch::Tensor>& params) {
  if (names.empty() && !params.empty())
    fail_runtime(optimizer +
                     " needs the parameters' names to tell the blocks' attention and MLP "
                     "matrices from embeddings, heads and classifiers",
                 "build it with make_optimizer(name, params, names, ...) "
                 "(torch::nn::Module::named_parameters())");
}

// Checks each group's settings with `check`, then that every projecting group's rank fits each
// of its matrices: a rank is only wrong for a given matrix, so each group's meets its own.
template <typename Options, typename Check>
void check_low_rank_groups(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                           Check check) {
  for (const auto& group : groups) {
    const auto& options = static_cast<const Options&>(group.options());
    check(options);
    if (!options.project() || !options.rank()) continue;
    const int64_t rank = *options.rank();
    for (const auto& p : group.params()) {
      if (p.dim() != 2) continue;
      TORCH_CHECK(rank <= std::min(p.size(0), p.size(1)), "Invalid rank value: ", rank,
                  " exceeds min(m, n) = ", std::min(p.size(0), p.size(1)), " of a (", p.size(0),
                  ", ", p.size(1), ") parameter");
    }
  }
}

// A parameter's fresh state with Adam's two moments: in R's shape for a projected matrix of
// rank r (`left` as projects_on_left says), else in the parameter's.
template <typename State>
std::unique_ptr<State> fresh_moments(const torch::Tensor& p, bool projected, bool left,
                                     int64_t r) {
  auto state = std::make_unique<State>();
  if (projected) {
    const auto shape = left ? std::vector<int64_t>{r, p.size(1)}   // (r, n)
                            : std::vector<int64_t>{p.size(0), r};  // (m, r)
    state->exp_avg(torch::zeros(shape, p.options()));
    state->exp_avg_sq(torch::zeros(shape, p.options()));
  } else {
    state->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    state->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
  }
  return state;
}

// AdamW's update of a parameter that is not projected (the decay already applied), in
// torch::optim::AdamW's order of operations; `step` counts from 1.
inline void adamw_moments_step(torch::Tensor& p, const torch::Tensor& grad, torch::Tensor& exp_avg,
                               torch::Tensor& exp_avg_sq, double beta1, double beta2,
                               int64_t step, double eps, double lr) {
  const double bias_correction1 = 1 - std::pow(beta1, step);
  const double bias_correction2 = 1 - std::pow(beta2, step);
  exp_avg.mul_(beta1).add_(grad, 1 - beta1);
  exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
  auto denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(eps);
  p.addcdiv_(exp_avg, denom, -lr / bias_correction1);
}

// What GaLore's and APOLLO's steps do first with a parameter: its state made on its first step
// (`rank_for(options, m, n)` gives a new projected matrix's rank), its step counted, the
// decoupled weight decay applied, and a parameter that is not projected stepped as AdamW.
// Returns its state when it is projected (the optimizer's own update follows, `left` as
// projects_on_left says), else nullptr.
template <typename State, typename Options, typename RankFor>
State* begin_low_rank_step(const Options& options, torch::Tensor& p,
                           std::unique_ptr<torch::optim::OptimizerParamState>& slot, bool& left,
                           RankFor rank_for) {
  const bool projected = options.project() && p.dim() == 2;
  left = projected && projects_on_left(p.size(0), p.size(1));
  if (!slot)
    slot = fresh_moments<State>(p, projected, left,
                                projected ? rank_for(options, p.size(0), p.size(1)) : 0);
  auto& state = static_cast<State&>(*slot);
  state.step(state.step() + 1);
  if (options.weight_decay() != 0) p.mul_(1 - options.lr() * options.weight_decay());
  if (projected) return &state;
  const auto [beta1, beta2] = options.betas();
  adamw_moments_step(p, p.grad(), state.exp_avg(), state.exp_avg_sq(), beta1, beta2,
                     state.step(), options.eps(), options.lr());
  return nullptr;
}

}  // namespace gradscope
