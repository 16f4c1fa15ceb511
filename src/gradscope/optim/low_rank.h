// What GaLore and APOLLO share: the side a matrix's projection takes, and Adam's moments in
// the projected shape (galore.h, apollo.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/torch.h>

namespace gradscope {

// Whether an (m, n) matrix is projected on the left (P (m, r), R = P^T G of shape (r, n)),
// else on the right (R of shape (m, r)): on its shorter side, and a square matrix on the right,
// as both papers' projectors decide (`shape[0] >= shape[1]`: right).
inline bool projects_on_left(int64_t m, int64_t n) { return m < n; }

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

}  // namespace gradscope
