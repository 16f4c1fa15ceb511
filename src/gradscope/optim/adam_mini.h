// Adam-mini (Zhang et al. 2024, "Adam-mini: Use Fewer Learning Rates To Gain More",
// arXiv:2406.16793; reference code github.com/zyushun/Adam-mini, adam_mini/adam_mini.py,
// version 1.1.1). AdamW's first moment per element, and one second moment per block of
// parameters instead of one per element: each parameter is cut into B contiguous blocks of
// equal size (rows of its (B, numel / B) view) and every element of block b shares v_b.
// At step t (from 1), for a parameter x with gradient g:
//
//   v_b <- beta2 v_b + (1 - beta2) mean_{i in b} g_i^2          (the block's mean square)
//   x   <- x (1 - lr wd)                                        (decoupled, as in AdamW)
//   m   <- beta1 m + (1 - beta1) g
//   x_i <- x_i - lr (m_i / (1 - beta1^t)) / (sqrt(v_b / (1 - beta2^t)) + eps)   (i in b)
//
// The blocks (`partition`), as the paper's Hessian structure and its reference code cut them:
// - "head": a query or key projection (out, in) by attention head, head_size rows each
//   (B = out / head_size);
// - "row": every other matrix by output row (B = rows): value and output projections, MLP
//   matrices, embeddings and the output head (one block per token or class); a tensor of
//   higher rank by its first dimension (a conv filter by output channel), after dropping
//   leading dimensions of size 1 (ViT's (1, T, C) positions by position, its (1, 1, C) class
//   token as one block); a vector (a norm's weight) as one block;
// - "element": biases, one v per element (B = numel), i.e. AdamW.
// `adam_mini_partition` maps parameter names to these, and the registry's adam-mini builds
// one parameter group per partition (with weight decay off for norms and biases, as the
// reference code).
//
// State: m (1x the parameter) and v (B values) per parameter, in the parameter's dtype: about
// half of AdamW's 2x.
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


struct AdamMiniOptions : public torch::optim::OptimizerCloneableOptions<AdamMiniOptions> {
  AdamMiniOptions(double lr = 1e-3) : lr_(lr) {}  // NOLINT: implicit, like LibTorch's options
  typedef std::tuple<double, double> betas_t;
  TORCH_ARG(double, lr) = 1e-3;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);  // Adam's, each in [0, 1)
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 0;  // decoupled, scaled by lr
  // How the group's parameters are cut into blocks that share v: "row" (default), "head"
  // (head_size rows per block; 2-D parameters only) or "element" (AdamW).
  TORCH_ARG(std::string, partition) = "row";
  TORCH_ARG(int64_t, head_size) = 0;  // rows per block under "head" (>= 1)

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

struct AdamMiniParamState : public torch::optim::OptimizerCloneableParamState<AdamMiniParamState>,
                            public StateBytes {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, exp_avg);     // m: the parameter's shape
  TORCH_ARG(torch::Tensor, exp_avg_sq);  // v: (B), one value per block

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  std::vector<torch::Tensor> state_tensors() const override { return {exp_avg_, exp_avg_sq_}; }
};

class AdamMini : public SerializingOptimizer<AdamMiniParamState, AdamMiniOptions> {
 public:
  explicit AdamMini(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                    AdamMiniOptions defaults = {});
  explicit AdamMini(std::vector<torch::Tensor> params, AdamMiniOptions defaults = {})
      : AdamMini({torch::optim::OptimizerParamGroup(std::move(params))}, defaults) {}

  torch::Tensor step(LossClosure closure = nullptr) override;

  // B, the number of blocks a parameter of these sizes has under `options`' partition.
  static int64_t blocks_for(const AdamMiniOptions& options, torch::IntArrayRef sizes);
};

// Where a named parameter goes (names as torch::nn::Module::named_parameters() gives them).
struct AdamMiniRole {
  std::string partition;     // "head", "row" or "element"
  bool weight_decay = true;  // whether --weight-decay applies to it
};

// The reference code's rule on gradscope's names, case-insensitive: a name containing "bias"
// is "element"; the weight of a query or key projection (q_proj, k_proj; the reference's wq,
// wk, query, key) is "head"; everything else is "row". Weight decay applies unless the name
// contains "norm", "ln" or "bias".
AdamMiniRole adam_mini_role(const std::string& name);

// The registry's adam-mini (factory.h): settings betas and eps; refuses parameters without
// names, and a query or key weight without its head size, as runtime errors.
struct OptimizerEntry;
OptimizerEntry adam_mini_entry();

}  // namespace gradscope
