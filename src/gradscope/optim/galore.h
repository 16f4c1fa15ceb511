// GaLore, Gradient Low-Rank Projection (Zhao et al. 2024, "GaLore: Memory-Efficient LLM
// Training by Gradient Low-Rank Projection", arXiv:2403.03507, Algorithm 2, the GaLore-AdamW
// variant). Every 2-D parameter W (m, n) of a projecting parameter group (`project`, the
// default) with gradient G is updated in a rank-r subspace; all other parameters (vectors,
// higher-dim tensors, and every parameter of a group with project=false) get plain AdamW,
// exactly torch.optim.AdamW. The paper projects the attention and MLP matrices of the
// transformer blocks only; embeddings, the head and a classifier get AdamW, as in its
// reference code (the "galore" group and the regular one). `galore_projects` is that rule on
// parameter names, and the registry's `galore` builds the two groups with it.
// At step t (from 1), for a projected W:
//
//   if (t - 1) % update_gap == 0:                   (steps 1, 1 + T, 1 + 2T, ...; T = update_gap)
//     U, S, V^T <- SVD(G)                          (full_matrices=false, in float32 or wider)
//     P <- U[:, :r]        (m, r)   if m <= n      (first r left singular vectors)
//     P <- V[:, :r]        (n, r)   if m >  n      (first r right singular vectors)
//   R <- P^T G  (r, n)   if m <= n;   R <- G P  (m, r)   if m > n
//   M <- beta1 M + (1 - beta1) R                   (M, V in R's shape; kept across refreshes,
//   V <- beta2 V + (1 - beta2) R^2                  as in the paper)
//   N <- (M / (1 - beta1^t)) / (sqrt(V / (1 - beta2^t)) + eps)
//   W <- W (1 - lr wd)                              (decoupled weight decay, as in AdamW)
//   W <- W - lr * scale * (P N  if m <= n,  N P^T  if m > n)
//
// scale is the paper's alpha (default 0.25); the paper's T is update_gap (default 200). The
// rank r applies to every matrix when set; unset, each matrix gets r = max(1, min(m, n) / 4),
// the paper's choice for its pretraining runs (rank 128 of d_model 512, 256 of 1024, 512 of
// 2048), so the default fits a model of any size. An explicit rank < 1 or above min(m, n) of
// any projected parameter is refused by the constructor.
//
// State per projected (m, n) parameter with m <= n: P (m r) + M and V (2 r n) values, against
// Adam's 2 m n (for m > n swap m and n); per other parameter 2x its size, as AdamW. The projector
// and the moments are kept in the parameter's dtype; the SVD runs in float32 (float64 for a float64
// parameter), since half-precision SVD is not available.
#pragma once

#include <string>
#include <tuple>
#include <vector>

#include <torch/torch.h>

#include "gradscope/optim/opt_reader.h"
#include "gradscope/optim/serializing_optimizer.h"
#include "gradscope/optim/state_bytes.h"

namespace gradscope {

struct GaloreOptions : public torch::optim::OptimizerCloneableOptions<GaloreOptions> {
  GaloreOptions(double lr = 1e-3) : lr_(lr) {}  // NOLINT: implicit, like LibTorch's options
  typedef std::tuple<double, double> betas_t;
  TORCH_ARG(double, lr) = 1e-3;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);  // Adam's, each in [0, 1)
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 0;  // decoupled, scaled by lr, on every parameter
  // r for every 2-D parameter, in [1, min(m, n)]; unset (nullopt): max(1, min(m, n) / 4) per
  // matrix. A smaller rank saves memory and loses more of each gradient.
  TORCH_ARG(c10::optional<int64_t>, rank);
  // T: steps between two SVDs of the gradient (>= 1). Each SVD costs O(m n min(m, n)); a
  // long gap saves that cost and keeps the subspace stale for longer.
  TORCH_ARG(int64_t, update_gap) = 200;
  TORCH_ARG(double, scale) = 0.25;  // alpha (> 0): multiplies the projected update
  // Whether the group's 2-D parameters are projected; false: AdamW for every parameter of the
  // group (the reference code's group of non-GaLore parameters).
  TORCH_ARG(bool, project) = true;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

struct GaloreParamState : public torch::optim::OptimizerCloneableParamState<GaloreParamState>,
                          public StateBytes {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, projector);   // P: (m, r) or (n, r); undefined unless projected
  TORCH_ARG(torch::Tensor, exp_avg);     // M: R's shape if projected, else the parameter's
  TORCH_ARG(torch::Tensor, exp_avg_sq);  // V: R's shape if projected, else the parameter's

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  std::vector<torch::Tensor> state_tensors() const override {
    return {projector_, exp_avg_, exp_avg_sq_};
  }
};

class Galore : public SerializingOptimizer<GaloreParamState, GaloreOptions> {
 public:
  explicit Galore(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                  GaloreOptions defaults = {});
  explicit Galore(std::vector<torch::Tensor> params, GaloreOptions defaults = {})
      : Galore({torch::optim::OptimizerParamGroup(std::move(params))}, defaults) {}

  torch::Tensor step(LossClosure closure = nullptr) override;

  // The rank a 2-D parameter of this shape gets under `options` (explicit, or min(m, n) / 4).
  static int64_t rank_for(const GaloreOptions& options, int64_t rows, int64_t cols);
};

// The modules whose weights GaLore projects by default: the blocks' attention projections
// (q_proj, k_proj, v_proj, o_proj) and MLP matrices (gate_proj, up_proj, down_proj of SwiGLU;
// fc1, fc2 of the GELU MLP; Wi, Wo of GeGLU), as gradscope's models name them.
const std::vector<std::string>& galore_default_targets();

// Whether GaLore projects the parameter called `name` (as torch::nn::Module::named_parameters()
// names it, e.g. "layers.0.self_attn.q_proj.weight") when it is 2-D: a `weight` inside a
// block (after a "layers.<i>" pair of components) with one of `targets` among the module
// names between the block and the weight. Embeddings, a head, a classifier, a modality
// projector and norms are not in a block's attention or MLP, so they are not projected.
bool galore_projects(const std::string& name, const std::vector<std::string>& targets);

// The parameter groups of an optimizer that treats the blocks' matrices apart (galore, apollo):
// the 2-D parameters galore_projects picks, with `options`, and every other one with
// `options` and project(false) (AdamW). A usage error naming `optimizer` when --opt targets
// (in `opt`) names no matrix.
template <typename Options>
std::vector<torch::optim::OptimizerParamGroup> projection_groups(
    const std::string& optimizer, const std::vector<torch::Tensor>& params,
    const std::vector<std::string>& names, const std::vector<std::string>& targets,
    const OptSettings& opt, const Options& options) {
  std::vector<torch::Tensor> projected, others;
  for (size_t i = 0; i < params.size(); ++i) {
    const bool target = params[i].dim() == 2 && galore_projects(names[i], targets);
    (target ? projected : others).push_back(params[i]);
  }
  if (projected.empty() && opt.count("targets"))
    fail_usage(
        optimizer + " targets=" + opt.at("targets") + " name no matrix in the model's blocks",
        "targets are names of modules inside the blocks, e.g. targets=q_proj,v_proj or "
        "targets=mlp (docs/optimizers.md)");
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!projected.empty())
    groups.emplace_back(std::move(projected), std::make_unique<Options>(options));
  if (!others.empty() || groups.empty())
    groups.emplace_back(std::move(others),
                        std::make_unique<Options>(Options(options).project(false)));
  return groups;
}

struct OptimizerEntry;
// The registry entry (factory.h).
OptimizerEntry galore_entry();

}  // namespace gradscope
