// Accumulation folded into the optimizer state: each micro-batch's gradient of a parameter is
// added into that parameter's optimizer state as soon as it exists (and can then be freed),
// and the parameter is moved once the step's last micro-batch was folded. No buffer of the
// step's summed gradient ever exists. The state is LibTorch's own (SGDParamState,
// AdamParamState, AdamWParamState), so its bytes, learning rate and serialization are those of
// the optimizer.
//
// Notation: the step's loss is the mean per target over the n targets of its N micro-batches;
// micro-batch i holds n_i of them, its backward yields g_i, the gradient of its summed loss
// over n (so the step's gradient is g = sum_i g_i), and w_i = n_i / n is its share of the
// step's targets. lambda is the weight decay, p the parameter (unchanged during the step).
//
// SGD with momentum mu and dampening d (PyTorch's rule: b = g + lambda p on the first step,
// else b = mu b + (1 - d)(g + lambda p); p -= lr b). The fold is exact up to the order of the
// float sums: the step's first fold applies the decay mu b and the weight decay once
// (b = mu b + (1 - d)(g_0 + lambda p), or b = g_0 + lambda p when no buffer exists yet), each
// later fold adds (1 - d) g_i (g_i on the buffer's first step), and the update is p -= lr b.
//
// Adam and AdamW: the fold is AdamA (Zhang et al. 2023, "Adam Accumulation to Reduce Memory
// Footprints of both Activations and Gradients for Large-scale DNN Training"): the moments are
// decayed once per step (m = b1 m, v = b2 v) and every micro-batch's gradient is added to them
// as it arrives, its square to the second moment:
//     m += (1 - b1) h_i,   v += (1 - b2) h_i^2,   h_i = g_i (+ w_i lambda p for Adam's L2),
// then, with the step count t (one per optimizer step, not per micro-batch) and Adam's bias
// corrections 1 - b1^t and 1 - b2^t, the update of Adam (AdamW: p *= 1 - lr lambda first):
//     p -= lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^t)) + eps)   (amsgrad: max of v over steps).
// The first moment is Adam's exactly (sum_i h_i = g + lambda p). The second is not: Adam takes
// (sum_i h_i)^2, which needs the summed gradient; AdamA takes sum_i h_i^2. Each micro-batch
// enters with its share of the step's loss (g_i carries the factor n_i / n, so micro-batches of
// unequal target counts weigh as their targets do; its own mean gradient G_i = g_i / w_i
// enters v with weight w_i^2). For gradient noise independent across micro-batches,
// E[sum_i g_i^2] = E[g^2] - |E g|^2 (1 - sum_i w_i^2): the noise part is Adam's, the squared
// mean is under-counted by the factor sum_i w_i^2 (1/N for equal micro-batches). With one
// micro-batch the rule is Adam's.
#pragma once

#include <string>

#include <torch/torch.h>

namespace gradscope {

// Why the state of `optimizer` cannot take micro-batch folds ("" when it can): only SGD with
// momentum (not Nesterov, whose update reads the step's whole gradient beside the buffer) and
// Adam and AdamW fold; plain SGD would move the parameter at every micro-batch.
std::string fold_refusal(const torch::optim::Optimizer& optimizer);

// Whether folding into `optimizer` changes its update rule (Adam, AdamW: AdamA's second moment).
bool fold_is_adama(const torch::optim::Optimizer& optimizer);

// What the micro-batches that gave a parameter no gradient add to an L2 weight decay (Adam):
// the sums of their shares w_j and of w_j^2. 0 when every micro-batch folded.
struct UnfoldedShares {
  double share = 0;
  double share_sq = 0;
};

// One parameter's folds into the state of `optimizer`, an optimizer over that parameter alone
// (as make_optimizer builds it) for which fold_refusal is empty. Runs without autograd.
class MicroBatchFold {
 public:
  MicroBatchFold(torch::optim::Optimizer& optimizer, torch::Tensor param);

  // Adds micro-batch i's gradient: `grad` is g_i, `share` its w_i. The step's first fold
  // decays the state first.
  void fold(const torch::Tensor& grad, double share);
  // Whether something was folded since the last update.
  bool pending() const { return folds_ > 0; }
  // Moves the parameter by the state the step's folds left, at the optimizer's learning rate.
  void update(const UnfoldedShares& unfolded = UnfoldedShares());

 private:
  enum class Kind { kSgd, kAdam, kAdamW };
  void fold_sgd(const torch::Tensor& grad);
  void fold_adam(const torch::Tensor& grad, double share);
  void update_sgd();
  void update_adam(const UnfoldedShares& unfolded);

  torch::optim::Optimizer& optimizer_;
  torch::Tensor param_;
  Kind kind_;
  int64_t folds_ = 0;          // this step's
  bool fresh_buffer_ = false;  // SGD: the buffer was created by this step's first fold
};

}  // namespace gradscope
