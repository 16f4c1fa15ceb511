#include "gradscope/optim/torch_optimizers.h"

#include <fmt/format.h>

#include <optional>
#include <type_traits>
#include <utility>

#include "gradscope/optim/factory.h"
#include "gradscope/optim/opt_reader.h"
#include "gradscope/optim/state_key.h"

namespace gradscope {
namespace {

// Function-local statics: the registry may be built during another file's static
// initialization.
const std::vector<std::string>& sgd_keys() {
  static const std::vector<std::string> keys = {"momentum", "dampening", "nesterov"};
  return keys;
}
const std::vector<std::string>& adam_keys() {
  static const std::vector<std::string> keys = {"betas", "eps", "amsgrad"};
  return keys;
}
const std::vector<std::string>& adagrad_keys() {
  static const std::vector<std::string> keys = {"lr_decay", "eps", "initial_accumulator_value"};
  return keys;
}

std::unique_ptr<torch::optim::Optimizer> make_sgd(std::vector<torch::Tensor> params,
                                                  const ParamInfo& /*info*/, double lr,
                                                  double weight_decay, const OptSettings& opt) {
  OptReader r("sgd", opt, sgd_keys());
  const double momentum = r.number("momentum", 0.0);
  const double dampening = r.number("dampening", 0.0);
  const bool nesterov = r.flag("nesterov", false);
  check_range(momentum >= 0, fmt::format("sgd momentum={} must be >= 0", momentum));
  check_range(!nesterov || (momentum > 0 && dampening == 0),
              "sgd nesterov=true needs momentum > 0 and dampening = 0");
  auto options = torch::optim::SGDOptions(lr)
                     .momentum(momentum)
                     .dampening(dampening)
                     .nesterov(nesterov)
                     .weight_decay(weight_decay);
  return construct_optimizer<torch::optim::SGD>("sgd", std::move(params), options);
}

// The parameters of one group that one call of the fused op updates: one device and dtype.
struct FusedAdamBatch {
  torch::Device device;
  torch::ScalarType dtype;
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
  std::vector<int64_t> steps;  // each parameter's step count, already incremented
};

// Whether ATen's fused Adam kernel takes `t` beside parameter `p`: the same device and dtype,
// stored densely in row-major order. The CPU kernel walks the parameter and its moments by
// one flat index (and makes a contiguous copy of a strided gradient), so a transposed or
// sliced parameter would get another element's update; the CUDA kernel wants every tensor
// of one layout.
bool fused_adam_layout(const torch::Tensor& t, const torch::Tensor& p) {
  return t.defined() && t.layout() == torch::kStrided && t.device() == p.device() &&
         t.scalar_type() == p.scalar_type() && t.is_contiguous();
}

// Adam and AdamW as LibTorch keeps them (options, per-parameter state and its serialisation,
// step counts as int64), whose step updates each group's parameters with ATen's fused kernel
// (at::_fused_adam_ / at::_fused_adamw_), as torch.optim's Adam(fused=True) does: one pass
// over each parameter that reads the gradient, moves both moments (and amsgrad's maximum)
// and the parameter, with no temporaries of the parameter's size. The same update as
// LibTorch's step; the kernel computes in float32 for float32, float16 and bfloat16
// parameters (rounding once per element, where LibTorch rounds each operation) and in float64
// for float64.
template <typename Base, typename Options, typename State>
class FusedAdamLike final : public Base {
 public:
  using Base::Base;

  torch::Tensor step(torch::optim::Optimizer::LossClosure closure = nullptr) override {
    torch::NoGradGuard no_grad;
    torch::Tensor loss = {};
    if (closure != nullptr) {
      at::AutoGradMode enable_grad(true);
      loss = closure();
    }
    // An optimizer with a parameter the kernel refuses (all_fusable) takes LibTorch's step.
    if (!all_fusable()) {
      Base::step(nullptr);
      return loss;
    }
    for (auto& group : this->param_groups()) step_group(group);
    return loss;
  }

 private:
  static constexpr bool kDecoupled = std::is_same<Base, torch::optim::AdamW>::value;

  // The kernel's devices (CPU and CUDA here; torch.optim also fuses on others that gradscope
  // does not run on) and dtypes (float32, float64, float16, bfloat16: its CPU and CUDA
  // kernels' dispatch); a dense gradient and state of the parameter's dtype and layout
  // (fused_adam_layout). Anything else (a sparse gradient, which LibTorch's step refuses by
  // name; a complex or integer parameter; a strided view; state loaded in another dtype;
  // amsgrad switched on over state saved without its maximum) takes LibTorch's step.
  bool all_fusable() {
    for (auto& group : this->param_groups()) {
      const bool amsgrad = static_cast<const Options&>(group.options()).amsgrad();
      for (const auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        const auto dtype = p.scalar_type();
        if (!(p.device().is_cpu() || p.device().is_cuda()) ||
            !(dtype == torch::kFloat32 || dtype == torch::kFloat64 || dtype == torch::kFloat16 ||
              dtype == torch::kBFloat16) ||
            !fused_adam_layout(p, p) || !fused_adam_layout(p.grad(), p))
          return false;
        const auto it = this->state().find(param_state_key(p));
        if (it == this->state().end()) continue;  // made below as LibTorch makes it
        const auto& s = static_cast<const State&>(*it->second);
        if (!fused_adam_layout(s.exp_avg(), p) || !fused_adam_layout(s.exp_avg_sq(), p) ||
            (amsgrad && !fused_adam_layout(s.max_exp_avg_sq(), p)))
          return false;
      }
    }
    return true;
  }

  // LibTorch's walk: every parameter with a gradient, its state made on its first step and
  // its step count incremented before the update reads it (as torch.optim's fused path does).
  void step_group(torch::optim::OptimizerParamGroup& group) {
    const auto& o = static_cast<const Options&>(group.options());
    std::vector<FusedAdamBatch> batches;
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = this->state()[param_state_key(p)];
      if (!slot) {
        auto fresh = std::make_unique<State>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        if (o.amsgrad()) fresh->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& s = static_cast<State&>(*slot);
      s.step(s.step() + 1);
      FusedAdamBatch* batch = nullptr;
      for (auto& b : batches)
        if (b.device == p.device() && b.dtype == p.scalar_type()) batch = &b;
      if (batch == nullptr)
        batch = &batches.emplace_back(FusedAdamBatch{p.device(), p.scalar_type()});
      batch->params.push_back(p);
      batch->grads.push_back(p.grad());
      batch->exp_avgs.push_back(s.exp_avg());
      batch->exp_avg_sqs.push_back(s.exp_avg_sq());
      if (o.amsgrad()) batch->max_exp_avg_sqs.push_back(s.max_exp_avg_sq());
      batch->steps.push_back(s.step());
    }
    for (const auto& b : batches) update(b, o);
  }

  // One call of the kernel. It reads the step counts as float32 tensors on the parameters'
  // device (torch.optim keeps its fused state's `step` so), here one tensor of them all.
  static void update(const FusedAdamBatch& b, const Options& o) {
    torch::Tensor counts = torch::empty({static_cast<int64_t>(b.steps.size())}, torch::kFloat32);
    float* count = counts.data_ptr<float>();
    for (size_t i = 0; i < b.steps.size(); ++i) count[i] = static_cast<float>(b.steps[i]);
    if (!b.device.is_cpu()) counts = counts.to(b.device);
    const std::vector<torch::Tensor> steps = counts.unbind();
    const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
    // No gradient scaler: grad_scale and found_inf stay empty.
    if (kDecoupled)
      at::_fused_adamw_(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, b.max_exp_avg_sqs, steps,
                        o.lr(), beta1, beta2, o.weight_decay(), o.eps(), o.amsgrad(),
                        /*maximize=*/false, std::nullopt, std::nullopt);
    else
      at::_fused_adam_(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, b.max_exp_avg_sqs, steps,
                       o.lr(), beta1, beta2, o.weight_decay(), o.eps(), o.amsgrad(),
                       /*maximize=*/false, std::nullopt, std::nullopt);
  }
};

using FusedAdam =
    FusedAdamLike<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState>;
using FusedAdamW =
    FusedAdamLike<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>;

// Adam and AdamW read the same settings; they differ in how weight decay enters the update.
template <typename Opt, typename Options>
std::unique_ptr<torch::optim::Optimizer> make_adam_like(const std::string& name,
                                                        std::vector<torch::Tensor> params,
                                                        double lr, double weight_decay,
                                                        const OptSettings& opt) {
  OptReader r(name, opt, adam_keys());
  const auto betas = r.pair("betas", {0.9, 0.999});
  const double eps = r.number("eps", 1e-8);
  check_betas(name, betas);
  check_range(eps >= 0, fmt::format("{} eps={} must be >= 0", name, eps));
  auto options = Options(lr)
                     .betas(std::make_tuple(betas.first, betas.second))
                     .eps(eps)
                     .amsgrad(r.flag("amsgrad", false))
                     .weight_decay(weight_decay);
  return construct_optimizer<Opt>(name, std::move(params), options);
}

std::unique_ptr<torch::optim::Optimizer> make_adam(std::vector<torch::Tensor> params,
                                                   const ParamInfo& /*info*/, double lr,
                                                   double weight_decay, const OptSettings& opt) {
  return make_adam_like<FusedAdam, torch::optim::AdamOptions>("adam", std::move(params), lr,
                                                              weight_decay, opt);
}

std::unique_ptr<torch::optim::Optimizer> make_adagrad(std::vector<torch::Tensor> params,
                                                      const ParamInfo& /*info*/, double lr,
                                                      double weight_decay, const OptSettings& opt) {
  OptReader r("adagrad", opt, adagrad_keys());
  const double lr_decay = r.number("lr_decay", 0.0);
  const double eps = r.number("eps", 1e-10);
  const double init = r.number("initial_accumulator_value", 0.0);
  check_range(lr_decay >= 0, fmt::format("adagrad lr_decay={} must be >= 0", lr_decay));
  check_range(eps >= 0, fmt::format("adagrad eps={} must be >= 0", eps));
  check_range(init >= 0, fmt::format("adagrad initial_accumulator_value={} must be >= 0", init));
  auto options = torch::optim::AdagradOptions(lr)
                     .lr_decay(lr_decay)
                     .eps(eps)
                     .initial_accumulator_value(init)
                     .weight_decay(weight_decay);
  return construct_optimizer<torch::optim::Adagrad>("adagrad", std::move(params), options);
}

std::unique_ptr<torch::optim::Optimizer> make_adamw(std::vector<torch::Tensor> params,
                                                    const ParamInfo& /*info*/, double lr,
                                                    double weight_decay, const OptSettings& opt) {
  return make_adam_like<FusedAdamW, torch::optim::AdamWOptions>("adamw", std::move(params), lr,
                                                                weight_decay, opt);
}

// Memory rules (memory_rule.h), from each update as LibTorch implements it (Adam's and
// AdamW's: ATen's fused kernel).

// The momentum buffer when momentum is set; nesterov's blend is one more temporary.
OptimizerMemory sgd_memory(const MemoryRuleInput& in) {
  const bool momentum = in.setting("momentum", 0) > 0;
  const bool nesterov = in.setting("nesterov", 0) > 0;
  return {momentum ? in.total() : 0, in.decay() + (nesterov ? in.largest() : 0)};
}

// State: exp_avg and exp_avg_sq (and amsgrad's max_exp_avg_sq) of every parameter. Scratch:
// the fused step (FusedAdamLike) updates each parameter in place, weight decay included, so
// its one allocation is the float32 step count the kernel reads, one per parameter. The rule
// models that step; LibTorch's, which an optimizer with a parameter the kernel refuses takes
// (FusedAdamLike::all_fusable), would hold two temporaries of the largest parameter's size,
// and Adam's weight decay one more.
OptimizerMemory adam_like_memory(const MemoryRuleInput& in) {
  const bool amsgrad = in.setting("amsgrad", 0) > 0;
  const int64_t step_counts = kOptimizerFloatBytes * static_cast<int64_t>(in.params().size());
  // Folded micro-batches (micro_batch_fold.cpp) end in LibTorch's update instead, whose one
  // temporary is a square root of the parameter's size.
  return {(amsgrad ? 3 : 2) * in.total(), step_counts, in.largest()};
}

// sum; std = sqrt(sum) + eps.
OptimizerMemory adagrad_memory(const MemoryRuleInput& in) {
  return {in.total(), in.largest() + in.decay()};
}

}  // namespace

OptimizerEntry sgd_entry() {
  OptimizerEntry e;
  e.make = make_sgd;
  e.default_lr = 1e-2;
  e.keys = sgd_keys();
  e.lr_by_model = toy_learning_rates(1e-3);
  e.steps_in_backward = true;
  e.same_bits_in_backward = true;
  e.folds_micro_batches = true;
  e.fold_hint = "pass --opt momentum=0.9 (and no nesterov)";
  e.elementwise = true;
  e.memory = sgd_memory;
  e.compared_in_estimate = true;
  return e;
}

OptimizerEntry adam_entry() {
  OptimizerEntry e;
  e.make = make_adam;
  e.default_lr = 1e-3;
  e.keys = adam_keys();
  e.lr_by_model = toy_learning_rates(1e-1);
  e.steps_in_backward = true;
  e.folds_micro_batches = true;
  e.elementwise = true;
  e.memory = adam_like_memory;
  e.compared_in_estimate = true;
  e.eight_bit_state = "adam8bit";
  return e;
}

OptimizerEntry adamw_entry() {
  OptimizerEntry e;
  e.make = make_adamw;
  e.default_lr = 1e-3;
  e.keys = adam_keys();
  e.lr_by_model = toy_learning_rates(1e-1);
  e.folds_micro_batches = true;
  e.elementwise = true;
  e.memory = adam_like_memory;
  e.compared_in_estimate = true;
  return e;
}

OptimizerEntry adagrad_entry() {
  OptimizerEntry e;
  e.make = make_adagrad;
  e.default_lr = 1e-2;
  e.keys = adagrad_keys();
  e.lr_by_model = toy_learning_rates(1.0);
  e.steps_in_backward = true;
  e.elementwise = true;
  e.memory = adagrad_memory;
  e.compared_in_estimate = true;
  return e;
}

}  // namespace gradscope
