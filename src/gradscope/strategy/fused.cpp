// The fused optimizer step: each parameter is updated during the backward pass, as soon as
// its gradient has been accumulated, and its gradient freed at once. No buffer of every
// gradient ever exists; the backward's peak drops by about the gradients' bytes.
//
// With micro-batches (accumulation+fused) each micro-batch's gradient of a parameter is folded
// into that parameter's optimizer state as soon as it is accumulated, and freed at once; after
// the step's last micro-batch was folded the parameter is updated (optim/micro_batch_fold.h
// gives the rules: SGD with momentum exactly, Adam and AdamW as AdamA). The strategy tells
// which micro-batch a backward belongs to (MicroBatchListener) before it starts. So the
// effective batch of accumulation costs the memory of one micro-batch and no gradient buffer.
//
// Each parameter gets an optimizer of its own, built by the optimizer factory from the run's
// settings, so hyperparameters are read as for the unfused run. The supported optimizers
// update each parameter elementwise from its own gradient and state, so the per-parameter
// updates are those of the one optimizer over all parameters. Gradient clipping needs the
// norm of all gradients before any update and cannot combine with it.
//
// The hook: `Tensor::register_hook` runs before the gradient is accumulated and cannot free
// it. The post hook of the parameter's AccumulateGrad node (grad_accumulator, add_post_hook,
// FunctionPostHook) runs after it. The tensor holds its AccumulateGrad node weakly: the
// updater keeps the nodes alive, or a later graph would get a fresh node without the hook.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/optim/factory.h"
#include "gradscope/optim/micro_batch_fold.h"
#include "gradscope/optim/state_bytes.h"
#include "gradscope/strategy/fused.h"

namespace gradscope {
namespace {

// Runs after AccumulateGrad has left the parameter's gradient in .grad: one optimizer step
// for that parameter, then the gradient freed.
class StepAfterAccumulate : public torch::autograd::FunctionPostHook {
 public:
  StepAfterAccumulate(torch::Tensor param, torch::optim::Optimizer* optimizer)
      : param_(std::move(param)), optimizer_(optimizer) {}

  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    if (param_.grad().defined()) {
      optimizer_->step();
      param_.mutable_grad() = torch::Tensor();
    }
    return outputs;
  }

 private:
  torch::Tensor param_;
  torch::optim::Optimizer* optimizer_;
};

// What the updaters that step in backward share: an optimizer of its own for each parameter,
// and no buffer of every gradient.
class PerParameterUpdater : public Updater {
 public:
  void set_learning_rate(double lr) override {
    for (auto& o : optimizers_) gradscope::set_learning_rate(*o, lr);
  }

  int64_t state_bytes() const override {
    int64_t total = 0;
    for (const auto& o : optimizers_) total += optimizer_state_bytes(*o);
    return total;
  }

  std::vector<torch::Tensor> state_tensors() const override {
    std::vector<torch::Tensor> out;
    for (const auto& o : optimizers_)
      for (auto& t : optimizer_state_tensors(*o)) out.push_back(std::move(t));
    return out;
  }

  std::optional<int64_t> grads_bytes() const override { return std::nullopt; }

  // One archive per parameter's optimizer, in the parameters' order. A fold's bookkeeping
  // lasts one step, so between steps the optimizers' states are everything.
  void save(torch::serialize::OutputArchive& archive) const override {
    archive.write("optimizers", torch::tensor(static_cast<int64_t>(optimizers_.size())));
    for (size_t i = 0; i < optimizers_.size(); ++i) {
      torch::serialize::OutputArchive one(archive.compilation_unit());
      optimizers_[i]->save(one);
      archive.write("o" + std::to_string(i), one);
    }
  }
  void load(torch::serialize::InputArchive& archive) override {
    torch::Tensor count;
    archive.read("optimizers", count);
    TORCH_CHECK(count.item<int64_t>() == static_cast<int64_t>(optimizers_.size()),
                "the saved state has ", count.item<int64_t>(),
                " per-parameter optimizers, this run ", optimizers_.size());
    for (size_t i = 0; i < optimizers_.size(); ++i) {
      torch::serialize::InputArchive one;
      archive.read("o" + std::to_string(i), one);
      optimizers_[i]->load(one);
    }
  }

 protected:
  std::vector<std::unique_ptr<torch::optim::Optimizer>> optimizers_;  // one per parameter
};

class InBackward : public PerParameterUpdater {
 public:
  InBackward(const std::vector<torch::Tensor>& params, const OptimizerSpec& spec) {
    for (const auto& p : params) {
      if (!p.requires_grad()) continue;
      optimizers_.push_back(make_optimizer(spec.name, {p}, spec.lr, spec.weight_decay, spec.opt));
      c10::intrusive_ptr<torch::autograd::Node> node = torch::autograd::impl::grad_accumulator(p);
      if (!node)
        fail_runtime("a parameter has no gradient accumulator",
                     "the fused step needs leaf parameters that require grad");
      node->add_post_hook(std::make_unique<StepAfterAccumulate>(p, optimizers_.back().get()));
      accumulators_.push_back(std::move(node));
    }
  }

  // The parameters were updated in backward and the gradients freed there: no norm can be
  // taken (recorded as null) and nothing is left to do here.
  UpdateResult step(const GradientFn& gradients, PhaseObserver& observer) override {
    UpdateResult r;
    r.out = gradients();
    r.evaluations = 1;
    observer.enter(Phase::kOptimizer);
    return r;
  }

 private:
  std::vector<c10::intrusive_ptr<torch::autograd::Node>> accumulators_;  // holding the hooks
};

std::string optimizer_list(const std::vector<std::string>& names = fused_optimizers()) {
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  return list;
}

// Accumulation without a gradient buffer: micro-batch i's gradient of a parameter is folded
// into the parameter's optimizer state by the post hook of its AccumulateGrad node and freed;
// the parameter moves in the hook of the step's last micro-batch, or, if that micro-batch gave
// it no gradient, when the step's backwards are done.
class FoldInBackward : public PerParameterUpdater, public MicroBatchListener {
 public:
  FoldInBackward(const StepPlan& plan, const std::vector<torch::Tensor>& params,
                 const OptimizerSpec& spec);

  UpdateResult step(const GradientFn& gradients, PhaseObserver& observer) override {
    UpdateResult r;
    r.out = gradients();
    r.evaluations = 1;
    observer.enter(Phase::kOptimizer);
    if (!current_ || current_->index + 1 != current_->count)
      fail_runtime("the step's micro-batches were not all announced before their backwards",
                   "the strategy must tell the updater of each micro-batch "
                   "(Strategy::set_micro_batch_listener)");
    for (size_t j = 0; j < params_.size(); ++j) {
      update(j);  // those the last micro-batch did not reach
      params_[j].mutable_grad() = torch::Tensor();
    }
    current_.reset();
    return r;
  }

  void before_backward(const MicroBatchInfo& info) override {
    // A step starts at micro-batch 0; the others follow in order.
    const int64_t expected = info.index == 0 ? 0 : (current_ ? current_->index + 1 : 0);
    if (info.index != expected || info.count != plan_count_)
      fail_runtime(fmt::format("micro-batch {} of {} announced where {} of {} was due", info.index,
                               info.count, expected, plan_count_),
                   "a step's micro-batches run in order, each announced once");
    if (info.index == 0) {
      // A step that ended part-way (an error mid-backward) left part of its gradient in the
      // optimizer state; a new step folded on top of it would start from corrupt moments.
      for (const auto& f : folds_)
        if (f.pending())
          fail_runtime("the optimizer state holds part of an unfinished step's gradient",
                       "a step that fails part-way ends the run; start it again");
      share_sum_ = 0;
      share_sq_sum_ = 0;
      for (auto& f : folded_) f = Folded();
    }
    current_ = info;
    share_ = info.step_targets > 0
                 ? static_cast<double>(info.targets) / static_cast<double>(info.step_targets)
                 : 0.0;
    share_sum_ += share_;
    share_sq_sum_ += share_ * share_;
  }

  // Parameter j's gradient of the current micro-batch is in its .grad.
  void on_gradient(size_t j) {
    torch::Tensor& p = params_[j];
    if (!p.grad().defined()) return;
    if (!current_)
      fail_runtime("a gradient arrived outside an announced micro-batch",
                   "the strategy must tell the updater of each micro-batch before its backward");
    Folded& f = folded_[j];
    if (f.last_index == current_->index)
      fail_runtime("a parameter received two gradients in one micro-batch's backward",
                   "the fold adds each micro-batch's gradient once; a parameter used by two "
                   "recomputed segments cannot be folded");
    folds_[j].fold(p.grad(), share_);
    p.mutable_grad() = torch::Tensor();  // freed before the update needs its temporaries
    f.last_index = current_->index;
    ++f.count;
    f.share += share_;
    f.share_sq += share_ * share_;
    if (current_->index + 1 == current_->count) update(j);
  }

  MicroBatchListener* micro_batch_listener() override { return this; }
  std::optional<std::string> update_rule() const override {
    // One micro-batch per step is Adam's own rule.
    if (plan_count_ > 1 && !optimizers_.empty() && fold_is_adama(*optimizers_.front()))
      return std::string("adama");
    return std::nullopt;
  }

 private:
  // What parameter j received this step.
  struct Folded {
    int64_t last_index = -1;  // the micro-batch of its last fold
    int64_t count = 0;
    double share = 0, share_sq = 0;
  };

  void update(size_t j) {
    if (!folds_[j].pending()) return;
    const Folded& f = folded_[j];
    UnfoldedShares missing;
    if (f.count < current_->count) {
      missing.share = std::max(0.0, share_sum_ - f.share);
      missing.share_sq = std::max(0.0, share_sq_sum_ - f.share_sq);
    }
    folds_[j].update(missing);
  }

  int64_t plan_count_;
  std::vector<torch::Tensor> params_;
  std::vector<MicroBatchFold> folds_;
  std::vector<Folded> folded_;
  std::vector<c10::intrusive_ptr<torch::autograd::Node>> accumulators_;  // holding the hooks
  std::optional<MicroBatchInfo> current_;    // the micro-batch whose backward runs
  double share_ = 0;                         // its share of the step's targets
  double share_sum_ = 0, share_sq_sum_ = 0;  // over the step's micro-batches so far
};

class FoldAfterAccumulate : public torch::autograd::FunctionPostHook {
 public:
  FoldAfterAccumulate(FoldInBackward* updater, size_t index) : updater_(updater), index_(index) {}

  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    updater_->on_gradient(index_);
    return outputs;
  }

 private:
  FoldInBackward* updater_;
  size_t index_;
};

// The hint of a refused fold: the settings that fold, where the optimizer's entry names some.
std::string fold_refusal_hint(const std::string& optimizer) {
  const char* settings = optimizer_registry().get(optimizer).fold_hint;
  const std::string buffer =
      "use --optimizer-step after-backward to accumulate in a gradient buffer";
  return settings ? std::string(settings) + ", or " + buffer : buffer;
}

FoldInBackward::FoldInBackward(const StepPlan& plan, const std::vector<torch::Tensor>& params,
                               const OptimizerSpec& spec)
    : plan_count_(plan.accum_steps) {
  for (const auto& p : params)
    if (p.requires_grad()) params_.push_back(p);
  optimizers_.reserve(params_.size());
  folds_.reserve(params_.size());
  for (size_t j = 0; j < params_.size(); ++j) {
    const torch::Tensor& p = params_[j];
    optimizers_.push_back(make_optimizer(spec.name, {p}, spec.lr, spec.weight_decay, spec.opt));
    if (j == 0) {
      const std::string refusal = fold_refusal(*optimizers_.front());
      check_usage(refusal.empty(),
                  fmt::format("strategy '{}' folds each micro-batch into the optimizer state, and "
                              "optimizer '{}' cannot take it: {}",
                              plan.strategy_name(), spec.name, refusal),
                  fold_refusal_hint(spec.name));
    }
    folds_.emplace_back(*optimizers_.back(), p);
    c10::intrusive_ptr<torch::autograd::Node> node = torch::autograd::impl::grad_accumulator(p);
    if (!node)
      fail_runtime("a parameter has no gradient accumulator",
                   "the fused step needs leaf parameters that require grad");
    node->add_post_hook(std::make_unique<FoldAfterAccumulate>(this, j));
    accumulators_.push_back(std::move(node));
  }
  folded_.assign(params_.size(), Folded());
}

}  // namespace

const std::vector<std::string>& fused_optimizers() {
  static const std::vector<std::string> names =
      optimizers_where([](const OptimizerEntry& e) { return e.steps_in_backward; });
  return names;
}

const std::vector<std::string>& folding_optimizers() {
  static const std::vector<std::string> names =
      optimizers_where([](const OptimizerEntry& e) { return e.folds_micro_batches; });
  return names;
}

std::unique_ptr<Updater> make_in_backward_updater(const StepPlan& plan,
                                                  const std::vector<torch::Tensor>& params,
                                                  const OptimizerSpec& optimizer,
                                                  const UpdaterOptions& options) {
  const std::string name = plan.strategy_name();
  if (plan.micro_batches) {
    // Accumulation without a gradient buffer: only optimizers whose state takes a fold.
    const auto& folding = folding_optimizers();
    check_usage(std::find(folding.begin(), folding.end(), optimizer.name) != folding.end(),
                fmt::format("strategy '{}' folds each micro-batch's gradient into the optimizer "
                            "state, and optimizer '{}' has no state that can take it",
                            name, optimizer.name),
                "optimizers that fold micro-batches: " + optimizer_list(folding) +
                    " (sgd with momentum); or use --optimizer-step after-backward to "
                    "accumulate in a gradient buffer");
    check_usage(options.clip_grad_norm == 0,
                fmt::format("strategy '{}' cannot clip gradients (--clip-grad-norm {}): each "
                            "micro-batch's gradient is folded into the optimizer state before "
                            "the norm of the step's gradient is known",
                            name, options.clip_grad_norm),
                "pass --clip-grad-norm 0, or use --optimizer-step after-backward to clip");
    return std::make_unique<FoldInBackward>(plan, params, optimizer);
  }
  const auto& names = fused_optimizers();
  check_usage(std::find(names.begin(), names.end(), optimizer.name) != names.end(),
              "strategy '" + name + "' does not support optimizer '" + optimizer.name + "'",
              "optimizers the fused step supports: " + optimizer_list());
  check_usage(options.clip_grad_norm == 0,
              fmt::format("strategy '{}' cannot clip gradients (--clip-grad-norm {}): each "
                          "parameter is updated before the norm of all gradients is known",
                          name, options.clip_grad_norm),
              "pass --clip-grad-norm 0, or use --optimizer-step after-backward to clip");
  return std::make_unique<InBackward>(params, optimizer);
}

}  // namespace gradscope
