#include "gradscope/optim/micro_batch_fold.h"

#include <cmath>
#include <memory>
#include <utility>

#include "gradscope/core/error.h"
#include "gradscope/optim/state_key.h"

namespace gradscope {
namespace {

const torch::optim::OptimizerOptions& fold_options(const torch::optim::Optimizer& optimizer) {
  TORCH_CHECK(optimizer.param_groups().size() == 1, "a micro-batch fold needs one parameter group");
  return optimizer.param_groups().front().options();
}

}  // namespace

std::string fold_refusal(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(fold_options(optimizer));
    if (o.momentum() == 0)
      return "SGD without momentum would move each parameter after every micro-batch: its "
             "update has no state to fold a micro-batch into";
    if (o.nesterov())
      return "Nesterov's update reads the step's whole gradient beside the momentum buffer, "
             "which no fold keeps";
    return "";
  }
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer) ||
      dynamic_cast<const torch::optim::AdamW*>(&optimizer))
    return "";
  return "its state cannot take a micro-batch's gradient apart from the others";
}

bool fold_is_adama(const torch::optim::Optimizer& optimizer) {
  return dynamic_cast<const torch::optim::Adam*>(&optimizer) ||
         dynamic_cast<const torch::optim::AdamW*>(&optimizer);
}

MicroBatchFold::MicroBatchFold(torch::optim::Optimizer& optimizer, torch::Tensor param)
    : optimizer_(optimizer), param_(std::move(param)), kind_(Kind::kSgd) {
  const std::string refusal = fold_refusal(optimizer);
  if (!refusal.empty()) fail_runtime("cannot fold micro-batches: " + refusal);
  if (dynamic_cast<torch::optim::Adam*>(&optimizer)) kind_ = Kind::kAdam;
  if (dynamic_cast<torch::optim::AdamW*>(&optimizer)) kind_ = Kind::kAdamW;
}

void MicroBatchFold::fold(const torch::Tensor& grad, double share) {
  torch::NoGradGuard no_grad;
  if (kind_ == Kind::kSgd)
    fold_sgd(grad);
  else
    fold_adam(grad, share);
  ++folds_;
}

void MicroBatchFold::update(const UnfoldedShares& unfolded) {
  if (folds_ == 0) return;  // no gradient this step: the optimizer would skip it too
  torch::NoGradGuard no_grad;
  if (kind_ == Kind::kSgd)
    update_sgd();
  else
    update_adam(unfolded);
  folds_ = 0;
}

// PyTorch's SGD: d_p = g + lambda p; b = clone(d_p) on the first step, else
// b = mu b + (1 - d) d_p. Here d_p arrives in parts: the weight decay goes with the first.
void MicroBatchFold::fold_sgd(const torch::Tensor& grad) {
  const auto& o = static_cast<const torch::optim::SGDOptions&>(fold_options(optimizer_));
  auto& states = optimizer_.state();
  const auto key = param_state_key(param_);
  auto it = states.find(key);
  if (folds_ == 0) {
    const torch::Tensor d_p = o.weight_decay() != 0 ? grad.add(param_, o.weight_decay()) : grad;
    fresh_buffer_ = it == states.end();
    if (fresh_buffer_) {
      auto state = std::make_unique<torch::optim::SGDParamState>();
      state->momentum_buffer(torch::clone(d_p).detach());
      states[key] = std::move(state);
    } else {
      auto& buffer = static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer();
      buffer.mul_(o.momentum()).add_(d_p, 1 - o.dampening());
    }
    return;
  }
  TORCH_CHECK(it != states.end(), "micro-batch fold: the momentum buffer disappeared mid-step");
  auto& buffer = static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer();
  // The buffer's first step is the step's gradient itself, undamped, as in PyTorch.
  buffer.add_(grad, fresh_buffer_ ? 1.0 : 1 - o.dampening());
}

void MicroBatchFold::update_sgd() {
  const auto& o = static_cast<const torch::optim::SGDOptions&>(fold_options(optimizer_));
  auto it = optimizer_.state().find(param_state_key(param_));
  TORCH_CHECK(it != optimizer_.state().end(), "micro-batch fold: no momentum buffer to update by");
  const auto& state = static_cast<const torch::optim::SGDParamState&>(*it->second);
  param_.add_(state.momentum_buffer(), -1 * o.lr());
}

namespace {

// Adam's and AdamW's options and states have the same fields under different types.
struct AdamView {
  double lr, beta1, beta2, eps, weight_decay;
  bool amsgrad;
  int64_t* step;
  torch::Tensor *exp_avg, *exp_avg_sq, *max_exp_avg_sq;
};

template <typename Options, typename State>
AdamView adam_view(torch::optim::Optimizer& optimizer, const torch::Tensor& param) {
  const auto& o = static_cast<const Options&>(fold_options(optimizer));
  auto& states = optimizer.state();
  const auto key = param_state_key(param);
  auto it = states.find(key);
  if (it == states.end()) {  // as Adam initializes it
    auto s = std::make_unique<State>();
    s->step(0);
    s->exp_avg(torch::zeros_like(param, torch::MemoryFormat::Preserve));
    s->exp_avg_sq(torch::zeros_like(param, torch::MemoryFormat::Preserve));
    if (o.amsgrad()) s->max_exp_avg_sq(torch::zeros_like(param, torch::MemoryFormat::Preserve));
    states[key] = std::move(s);
    it = states.find(key);
  }
  auto& s = static_cast<State&>(*it->second);
  // The TORCH_ARG accessors return references to the fields.
  return {o.lr(),
          std::get<0>(o.betas()),
          std::get<1>(o.betas()),
          o.eps(),
          o.weight_decay(),
          o.amsgrad(),
          &s.step(),
          &s.exp_avg(),
          &s.exp_avg_sq(),
          &s.max_exp_avg_sq()};
}

AdamView view_of(torch::optim::Optimizer& optimizer, const torch::Tensor& param, bool adamw) {
  return adamw
             ? adam_view<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(optimizer,
                                                                                    param)
             : adam_view<torch::optim::AdamOptions, torch::optim::AdamParamState>(optimizer, param);
}

}  // namespace

void MicroBatchFold::fold_adam(const torch::Tensor& grad, double share) {
  const AdamView a = view_of(optimizer_, param_, kind_ == Kind::kAdamW);
  if (folds_ == 0) {
    a.exp_avg->mul_(a.beta1);
    a.exp_avg_sq->mul_(a.beta2);
  }
  // Adam's L2 term enters each micro-batch's gradient with the micro-batch's share of the loss,
  // so the terms sum to lambda p as in Adam; AdamW decays the parameter in the update instead.
  const bool l2 = kind_ == Kind::kAdam && a.weight_decay != 0;
  const torch::Tensor h = l2 ? grad.add(param_, a.weight_decay * share) : grad;
  a.exp_avg->add_(h, 1 - a.beta1);
  a.exp_avg_sq->addcmul_(h, h, 1 - a.beta2);
}

void MicroBatchFold::update_adam(const UnfoldedShares& unfolded) {
  const AdamView a = view_of(optimizer_, param_, kind_ == Kind::kAdamW);
  if (kind_ == Kind::kAdam && a.weight_decay != 0 && unfolded.share > 0) {
    // Micro-batches that did not reach this parameter: their gradient is their L2 term alone.
    a.exp_avg->add_(param_, (1 - a.beta1) * a.weight_decay * unfolded.share);
    a.exp_avg_sq->addcmul_(param_, param_,
                           (1 - a.beta2) * a.weight_decay * a.weight_decay * unfolded.share_sq);
  }
  *a.step += 1;
  const double bias_correction1 = 1 - std::pow(a.beta1, static_cast<double>(*a.step));
  const double bias_correction2 = 1 - std::pow(a.beta2, static_cast<double>(*a.step));
  if (kind_ == Kind::kAdamW && a.weight_decay != 0) param_.mul_(1 - a.lr * a.weight_decay);
  if (a.amsgrad) torch::max_out(*a.max_exp_avg_sq, *a.exp_avg_sq, *a.max_exp_avg_sq);
  // LibTorch's formula with one temporary of the parameter's size, the square root, scaled
  // and shifted in place (the estimate counts that one).
  torch::Tensor denom = (a.amsgrad ? *a.max_exp_avg_sq : *a.exp_avg_sq).sqrt();
  denom.div_(std::sqrt(bias_correction2)).add_(a.eps);
  param_.addcdiv_(*a.exp_avg, denom, -a.lr / bias_correction1);
}

}  // namespace gradscope
