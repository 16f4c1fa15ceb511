// The fused optimizer step: each parameter is updated during the backward pass, as soon as
// its gradient has been accumulated, and its gradient freed at once. No buffer of every
// gradient ever exists; the backward's peak drops by about the gradients' bytes.
//
// Each parameter gets an optimizer of its own, built by the optimizer factory from the run's
// settings, so hyperparameters are read as for the unfused run. The supported optimizers
// update each parameter elementwise from its own gradient and state, so the per-parameter
// updates are those of the one optimizer over all parameters. Gradient clipping needs the
// norm of all gradients before any update and cannot combine with it.
//
// The hook: `Tensor::register_hook` runs before the gradient is accumulated and cannot free
// it. The post hook of the parameter's AccumulateGrad node runs after it. This node API
// (grad_accumulator, add_post_hook, FunctionPostHook) is the same in LibTorch 1.13 and 2.x,
// so one code path serves both versions. The tensor holds its AccumulateGrad node weakly: the
// updater keeps the nodes alive, or a later graph would get a fresh node without the hook.
#include <algorithm>
#include <utility>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/optim/factory.h"
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

class InBackward : public Updater {
 public:
  InBackward(const std::vector<torch::Tensor>& params, const OptimizerSpec& spec) {
    for (const auto& p : params) {
      if (!p.requires_grad()) continue;
      optimizers_.push_back(make_optimizer(spec.name, {p}, spec.lr, spec.weight_decay, spec.opt));
      std::shared_ptr<torch::autograd::Node> node = torch::autograd::impl::grad_accumulator(p);
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
    observer.enter(Phase::kPhaseOptimizer);
    return r;
  }

  void set_learning_rate(double lr) override {
    for (auto& o : optimizers_) gradscope::set_learning_rate(*o, lr);
  }

  int64_t state_bytes() const override {
    int64_t total = 0;
    for (const auto& o : optimizers_) total += optimizer_state_bytes(*o);
    return total;
  }

  std::optional<int64_t> grads_bytes() const override { return std::nullopt; }

 private:
  std::vector<std::unique_ptr<torch::optim::Optimizer>> optimizers_;  // one per parameter
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // holding the hooks
};

std::string optimizer_list() {
  std::string list;
  for (const auto& n : fused_optimizers()) list += (list.empty() ? "" : ", ") + n;
  return list;
}

}  // namespace

const std::vector<std::string>& fused_optimizers() {
  static const std::vector<std::string> names = {"sgd", "adam", "adagrad", "adadelta"};
  return names;
}

std::unique_ptr<Updater> make_in_backward_updater(const StepPlan& plan,
                                                  const std::vector<torch::Tensor>& params,
                                                  const OptimizerSpec& optimizer,
                                                  const UpdaterOptions& options) {
  const std::string name = plan.strategy_name();
  const auto& names = fused_optimizers();
  check_usage(std::find(names.begin(), names.end(), optimizer.name) != names.end(),
              "strategy '" + name + "' does not support optimizer '" + optimizer.name + "'",
              "optimizers the fused step supports: " + optimizer_list());
  check_usage(options.clip_grad_norm == 0,
              fmt::format("strategy '{}' cannot clip gradients (--clip-grad-norm {}): each "
                          "parameter is updated before the norm of all gradients is known",
                          name, options.clip_grad_norm),
              "pass --clip-grad-norm 0, or use --optimizer-step after-backward to clip");
  check_usage(!plan.micro_batches,
              fmt::format("strategy '{}' updates each parameter in backward, so it cannot sum "
                          "micro-batches (--accum-steps {})",
                          name, plan.accum_steps),
              "use --accum-steps 1 and a strategy without accumulation for the fused step");
  return std::make_unique<InBackward>(params, optimizer);
}

}  // namespace gradscope
