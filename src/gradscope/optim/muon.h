// Muon, MomentUm Orthogonalized by Newton-Schulz (Keller Jordan et al. 2024, "Muon: An
// optimizer for hidden layers in neural networks", kellerjordan.github.io/posts/muon;
// reference code github.com/KellerJordan/Muon, muon.py, SingleDeviceMuonWithAuxAdam), with
// the update scale of Liu et al. 2025 ("Muon is Scalable for LLM Training", arXiv:2502.16982,
// Moonlight) as an option. The hidden matrices W (m, n) of a Muon group (`use_muon`, the
// default) with gradient G and momentum M (zero at the start), at each step:
//
//   M <- mu M + (1 - mu) G
//   U <- (1 - mu) G + mu M    if nesterov (the default), else U <- M
//   O <- NS5(U)                                  (close to the orthogonal factor of U's SVD)
//   W <- W (1 - lr wd)                           (decoupled weight decay)
//   W <- W - lr s O,   s = max(1, m / n)^0.5     (update_scale "reference")
//                      s = 0.2 sqrt(max(m, n))   (update_scale "moonlight": the RMS of
//                                                 AdamW's update, so AdamW's lr carries over)
//
// NS5 is the quintic Newton-Schulz iteration of the reference code: X <- U (transposed when
// m > n), X <- X / (||X||_F + 1e-7), then ns_steps times A = X X^T, X <- a X + (b A + c A A) X
// with (a, b, c) = (3.4445, -4.7750, 2.0315), transposed back. It does not converge to U V^T
// but maps every singular value that is not tiny into about [0.7, 1.2]. It runs in `ns_dtype`:
// "bfloat16" as the reference does, or "float32" (float64 for float64 parameters). A tensor of
// more than two dimensions is taken as (size(0), rest).
//
// Every other parameter (a group with use_muon false: embeddings, the head, a classifier,
// norms, biases) gets AdamW with its own rate adamw_lr, betas and eps, as the reference's
// auxiliary Adam: m <- lerp(m, g, 1 - b1), v <- lerp(v, g^2, 1 - b2),
// x <- x (1 - adamw_lr wd) - adamw_lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
//
// State: M (1x) per Muon matrix; m and v (2x) per AdamW parameter; in the parameter's dtype.
#pragma once

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <torch/torch.h>

#include "gradscope/optim/opt_reader.h"
#include "gradscope/optim/serializing_optimizer.h"
#include "gradscope/optim/state_bytes.h"

namespace gradscope {


struct MuonOptions : public torch::optim::OptimizerCloneableOptions<MuonOptions> {
  MuonOptions(double lr = 0.02) : lr_(lr) {}  // NOLINT: implicit, like LibTorch's options
  typedef std::tuple<double, double> betas_t;
  TORCH_ARG(double, lr) = 0.02;        // the Muon matrices' rate
  TORCH_ARG(double, momentum) = 0.95;  // mu, in [0, 1)
  TORCH_ARG(bool, nesterov) = true;
  TORCH_ARG(int64_t, ns_steps) = 5;     // Newton-Schulz iterations (>= 1)
  TORCH_ARG(double, weight_decay) = 0;  // decoupled, scaled by the group's rate, on every group
  // "reference": s = max(1, m / n)^0.5; "moonlight": s = 0.2 sqrt(max(m, n)).
  TORCH_ARG(std::string, update_scale) = "reference";
  // "bfloat16" (the reference's) or "float32": the dtype Newton-Schulz runs in.
  TORCH_ARG(std::string, ns_dtype) = "bfloat16";
  // Whether the group's parameters (each of at least 2 dimensions) get Muon; false: AdamW.
  TORCH_ARG(bool, use_muon) = true;
  TORCH_ARG(double, adamw_lr) = 3e-4;  // the AdamW parameters' rate
  TORCH_ARG(betas_t, adamw_betas) = std::make_tuple(0.9, 0.95);
  TORCH_ARG(double, adamw_eps) = 1e-10;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override { return lr(); }
  // A schedule sets lr; adamw_lr follows by the same factor, so the two keep their ratio (as
  // a schedule in the reference multiplies every group's initial rate).
  void set_lr(const double lr) override {
    if (lr_ > 0) adamw_lr_ *= lr / lr_;
    this->lr(lr);
  }
};

struct MuonParamState : public torch::optim::OptimizerCloneableParamState<MuonParamState>,
                        public StateBytes {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, momentum_buffer);  // M: Muon parameters only
  TORCH_ARG(torch::Tensor, exp_avg);          // m: AdamW parameters only
  TORCH_ARG(torch::Tensor, exp_avg_sq);       // v: AdamW parameters only

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  std::vector<torch::Tensor> state_tensors() const override {
    return {momentum_buffer_, exp_avg_, exp_avg_sq_};
  }
};

class Muon : public SerializingOptimizer<MuonParamState, MuonOptions> {
 public:
  explicit Muon(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                MuonOptions defaults = {});
  explicit Muon(std::vector<torch::Tensor> params, MuonOptions defaults = {})
      : Muon({torch::optim::OptimizerParamGroup(std::move(params))}, defaults) {}

  torch::Tensor step(LossClosure closure = nullptr) override;

  // s, the factor of lr for an (m, n) matrix under `update_scale`.
  static double update_scale_for(const std::string& update_scale, int64_t rows, int64_t cols);
};

// NS5(U) for a matrix U (m, n), computed in `dtype` and returned in it (see above).
torch::Tensor newton_schulz5(const torch::Tensor& u, int64_t steps, torch::ScalarType dtype);

// The registry's muon (factory.h): the blocks' 2-D attention and MLP weights (galore_projects
// with galore_default_targets) get Muon, every other parameter AdamW. Refuses parameters
// without names (a runtime error).
struct OptimizerEntry;
OptimizerEntry muon_entry();

}  // namespace gradscope
