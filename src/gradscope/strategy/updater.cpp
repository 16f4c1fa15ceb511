// The optimizer step after backward: one optimizer over every parameter, stepped once the
// step's gradients are complete (or, for a line search, driven through a closure).
#include "gradscope/strategy/updater.h"

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/core/tensors.h"
#include "gradscope/optim/factory.h"
#include "gradscope/optim/state_bytes.h"
#include "gradscope/strategy/fused.h"
#include "gradscope/strategy/rng_state.h"

namespace gradscope {
namespace {

// The global L2 norm of the gradients, read from the device once.
double grad_norm(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> norms;
  for (const auto& p : params)
    if (p.grad().defined()) norms.push_back(p.grad().norm());
  if (norms.empty()) return 0;
  return torch::stack(norms).norm().item<double>();
}

void free_grads(const std::vector<torch::Tensor>& params) {
  for (const auto& p : params) {
    torch::Tensor t = p;
    t.mutable_grad() = torch::Tensor();
  }
}

class AfterBackward : public Updater {
 public:
  AfterBackward(const std::vector<torch::Tensor>& params, const OptimizerSpec& spec,
                const UpdaterOptions& options)
      : params_(params),
        options_(options),
        optimizer_(make_optimizer(spec.name, params,
                                  ParamInfo{spec.param_names, spec.param_head_sizes}, spec.lr,
                                  spec.weight_decay, spec.opt)),
        line_search_(optimizer_registry().get(spec.name).steps_with_closure) {
    check_usage(!line_search_ || options.clip_grad_norm == 0,
                "optimizer '" + spec.name +
                    "' evaluates its own gradients along its line search; --clip-grad-norm "
                    "cannot apply to them",
                "leave --clip-grad-norm out with " + spec.name);
  }

  UpdateResult step(const GradientFn& gradients, PhaseObserver& observer) override {
    UpdateResult r;
    if (line_search_) {
      // The optimizer evaluates the step's batch itself: first where the step starts (the
      // loss and gradient recorded), then at each trial point of its line search. A line
      // search compares values of one function, so every evaluation starts from the generator
      // states the step found and draws the same dropout masks (else each trial point would
      // see other masks, and a noise difference could pass for a decrease). After the step the
      // generators are where the first evaluation left them, as after a step without a line
      // search: the next step draws fresh masks, and the stream depends on the seed alone, not
      // on how many trial points the search took.
      const torch::Device device = params_.empty() ? torch::kCPU : params_.front().device();
      const RngState start = RngState::capture(device);
      std::optional<RngState> after_first;
      auto closure = [&]() -> torch::Tensor {
        free_grads(params_);
        start.restore();
        const StepOutput o = gradients();
        if (!after_first) after_first = RngState::capture(device);
        observer.enter(Phase::kOptimizer);
        if (r.evaluations++ == 0) {
          r.out = o;
          measure_gradients(r);
        }
        return o.loss_sum / static_cast<double>(std::max<int64_t>(o.target_count, 1));
      };
      optimizer_->step(closure);
      if (after_first) after_first->restore();
    } else {
      r.out = gradients();
      r.evaluations = 1;
      observer.enter(Phase::kOptimizer);
      if (options_.clip_grad_norm > 0) {
        if (!grads_bytes_) grads_bytes_ = gradscope::grads_bytes(params_);
        r.grad_norm = torch::nn::utils::clip_grad_norm_(params_, options_.clip_grad_norm);
      } else {
        measure_gradients(r);
      }
      optimizer_->step();
    }
    free_grads(params_);
    return r;
  }

  void set_learning_rate(double lr) override { gradscope::set_learning_rate(*optimizer_, lr); }
  int64_t state_bytes() const override { return optimizer_state_bytes(*optimizer_); }
  std::vector<torch::Tensor> state_tensors() const override {
    return optimizer_state_tensors(*optimizer_);
  }
  std::optional<int64_t> grads_bytes() const override { return grads_bytes_; }
  void save(torch::serialize::OutputArchive& archive) const override { optimizer_->save(archive); }
  void load(torch::serialize::InputArchive& archive) override { optimizer_->load(archive); }

 private:
  // The gradients' bytes (once: they are the same every step) and, when the record wants
  // it, their global norm.
  void measure_gradients(UpdateResult& r) {
    if (!grads_bytes_) grads_bytes_ = gradscope::grads_bytes(params_);
    if (options_.log_grad_norm) r.grad_norm = grad_norm(params_);
  }

  std::vector<torch::Tensor> params_;
  UpdaterOptions options_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  bool line_search_;
  std::optional<int64_t> grads_bytes_;
};

}  // namespace

std::unique_ptr<Updater> make_updater(const StepPlan& plan,
                                      const std::vector<torch::Tensor>& params,
                                      const OptimizerSpec& optimizer,
                                      const UpdaterOptions& options) {
  if (plan.optimizer_step == OptimizerStep::kInBackward)
    return make_in_backward_updater(plan, params, optimizer, options);
  return std::make_unique<AfterBackward>(params, optimizer, options);
}

}  // namespace gradscope
