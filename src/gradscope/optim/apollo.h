// APOLLO and APOLLO-Mini, Approximated Gradient Scaling for Memory-Efficient LLM Optimization
// (Zhu et al. 2024, "APOLLO: SGD-like Memory, AdamW-level Performance", arXiv:2412.05270,
// Algorithm 1), as the authors' reference code computes it (APOLLOAdamW with its random
// projector, github.com/zhuhanqing/APOLLO). Every 2-D parameter W (m, n) of a projecting group
// (`project`, the default) moves along its raw gradient G, each channel (APOLLO) or the whole
// tensor (APOLLO-Mini) scaled by how much AdamW rescales a random rank-r sketch of G; every
// other parameter gets plain AdamW, exactly torch.optim.AdamW. The registry's `apollo` and
// `apollo-mini` project the blocks' attention and MLP matrices (galore_projects, galore.h),
// as the reference code's "attn"/"mlp" parameter group does.
// At step t (from 1), for a projected W; "left" when m < n, else "right" (ties go right):
//
//   k = (t - 1) / T                        (integer division; T = update_proj_gap: P changes
//                                           at steps 1, 1 + T, 1 + 2T, ...)
//   P <- randn(m, r) / sqrt(r)  (left);  randn(r, n) / sqrt(r)  (right)
//        drawn in float32 by a CPU generator seeded with hash3(seed, i, k) (core/rng.h; i the
//        parameter's position among all groups' parameters, from 0), then cast to W's dtype.
//        Regenerated at every step from (seed, i, k), never kept (apollo_projection).
//   R <- P^T G  (r, n) (left);   R <- G P^T  (m, r) (right)
//   M <- beta1 M + (1 - beta1) R;   V <- beta2 V + (1 - beta2) R^2   (R's shape; kept when P
//                                                                    changes, as in the paper)
//   N <- M / (sqrt(V) + eps)                                   (the bias corrections are below)
//   s <- ||N[:, j]|| / (||R[:, j]|| + 1e-8)  per column j (left) or row (right)  ("channel")
//   s <- ||N|| / (||R|| + 1e-8)                                                   ("tensor")
//   U <- G s                     (each column, or row, of G times its own factor)
//   norm-growth limiter (`limiter`; Fira, Chen et al. 2024, arXiv:2410.01623):
//     step 1: u <- ||U||;  later: c <- max(||U|| / (u + 1e-8), 1.01) / 1.01; U <- U / c;
//     u <- ||U||                  (so ||U|| grows by at most 1.01x per step)
//   W <- W (1 - lr wd)            (decoupled weight decay, as in AdamW)
//   W <- W - lr sqrt(1 - beta2^t) / (1 - beta1^t) sqrt(scale) U
//
// `scale` is the reference code's: the update is multiplied by sqrt(scale), so the paper's
// alpha = sqrt(128) of APOLLO-Mini is scale = 128 (its default here; APOLLO's is 1). eps
// (default 1e-6, the reference's) enters N before the bias corrections, as in the reference.
// The rank r applies to every projected matrix when set; unset, each gets
// max(1, min(m, n) / 4), the reference scripts' quarter of the model width (128 of 512, 256
// of 1024). APOLLO-Mini is rank 1 and "tensor". A rank above min(m, n) of any projected matrix
// is refused by the constructor.
//
// State per projected (m, n) parameter: M and V, 2 r max(m, n) values (r rows or columns
// along the longer side), plus the limiter's u (one value) when it is on, all in the
// parameter's dtype; P is not kept. APOLLO-Mini: 2 max(m, n) + 1 values. Every other parameter:
// 2x its size (AdamW).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <torch/torch.h>

#include "gradscope/optim/opt_reader.h"
#include "gradscope/optim/serializing_optimizer.h"
#include "gradscope/optim/state_bytes.h"

namespace gradscope {


// How the scaling factor is shared: per channel (APOLLO) or per tensor (APOLLO-Mini).
enum class ApolloScaleType {
  kChannel,  // one factor per column (m < n) or row (m >= n) of the parameter
  kTensor,   // one factor for the whole parameter
};

struct ApolloOptions : public torch::optim::OptimizerCloneableOptions<ApolloOptions> {
  ApolloOptions(double lr = 1e-2) : lr_(lr) {}  // NOLINT: implicit, like LibTorch's options
  typedef std::tuple<double, double> betas_t;
  TORCH_ARG(double, lr) = 1e-2;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);  // Adam's, each in [0, 1)
  TORCH_ARG(double, eps) = 1e-6;                            // >= 0; the reference code's default
  TORCH_ARG(double, weight_decay) = 0;  // decoupled, scaled by lr, on every parameter
  // r for every projected matrix, in [1, min(m, n)]; unset (nullopt): max(1, min(m, n) / 4)
  // per matrix. The moments take 2 r max(m, n) values; a larger rank estimates the factors
  // more closely.
  TORCH_ARG(c10::optional<int64_t>, rank);
  // T: steps between two draws of P (>= 1). A draw costs nothing but time (P is regenerated
  // at every step anyway); a new P makes the moments mix two sketches for a while.
  TORCH_ARG(int64_t, update_proj_gap) = 200;
  TORCH_ARG(double, scale) = 1.0;  // > 0: the update is multiplied by sqrt(scale)
  TORCH_ARG(ApolloScaleType, scale_type) = ApolloScaleType::kChannel;
  // Seeds P with the parameter's position and the draw's count (>= 0): the same run draws
  // the same matrices, and a run resumed from saved state draws them again.
  TORCH_ARG(int64_t, seed) = 0;
  TORCH_ARG(bool, limiter) = true;  // the norm-growth limiter (gamma 1.01), on as in the paper
  // Whether the group's 2-D parameters are projected; false: AdamW for every parameter of the
  // group (the reference code's group of regular parameters).
  TORCH_ARG(bool, project) = true;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

struct ApolloParamState : public torch::optim::OptimizerCloneableParamState<ApolloParamState>,
                          public StateBytes {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, exp_avg);     // M: R's shape if projected, else the parameter's
  TORCH_ARG(torch::Tensor, exp_avg_sq);  // V: R's shape if projected, else the parameter's
  // u: the last step's ||U|| after the limiter (0-dim); undefined unless projected with the
  // limiter on, and before the first step.
  TORCH_ARG(torch::Tensor, update_norm);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  std::vector<torch::Tensor> state_tensors() const override {
    return {exp_avg_, exp_avg_sq_, update_norm_};
  }
};

class Apollo : public SerializingOptimizer<ApolloParamState, ApolloOptions> {
 public:
  explicit Apollo(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                  ApolloOptions defaults = {});
  explicit Apollo(std::vector<torch::Tensor> params, ApolloOptions defaults = {})
      : Apollo({torch::optim::OptimizerParamGroup(std::move(params))}, defaults) {}

  torch::Tensor step(LossClosure closure = nullptr) override;

  // The rank a 2-D parameter of this shape gets under `options` (explicit, or min(m, n) / 4).
  static int64_t rank_for(const ApolloOptions& options, int64_t rows, int64_t cols);

 protected:
  // P for `param` (at position `index` among all groups' parameters) at draw `draw` (k
  // above): apollo_projection. A test substitutes a fixed P (the identity) here.
  virtual torch::Tensor projection(const ApolloOptions& options, const torch::Tensor& param,
                                   int64_t index, int64_t draw, int64_t rank) const;
};

// The random projection of an (rows, cols) parameter: (rows, rank) when rows < cols (R = P^T G),
// else (rank, cols) (R = G P^T); entries N(0, 1/rank), drawn in float32 by a CPU generator of
// its own seeded with hash3(seed, index, draw), then converted to `options` (dtype, device).
// A function of its arguments alone: the global generator is neither read nor advanced.
torch::Tensor apollo_projection(int64_t seed, int64_t index, int64_t draw, int64_t rows,
                                int64_t cols, int64_t rank, const torch::TensorOptions& options);

// The registry's entries (factory.h). Both project the matrices galore_projects picks by name
// (`targets`) and give every other parameter AdamW; both need the parameters' names.
// apollo: channel-wise, rank unset (min(m, n) / 4 per matrix), scale 1. apollo-mini: rank 1,
// tensor-wise, scale 128 (alpha = sqrt(128)).
struct OptimizerEntry;
OptimizerEntry apollo_entry();
OptimizerEntry apollo_mini_entry();

}  // namespace gradscope
