#include "gradscope/optim/torch_optimizers.h"

#include <fmt/format.h>

#include "gradscope/optim/factory.h"
#include "gradscope/optim/opt_reader.h"

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
  return make_adam_like<torch::optim::Adam, torch::optim::AdamOptions>("adam", std::move(params),
                                                                       lr, weight_decay, opt);
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
  return make_adam_like<torch::optim::AdamW, torch::optim::AdamWOptions>("adamw", std::move(params),
                                                                         lr, weight_decay, opt);
}

// Memory rules (memory_rule.h), from each update as LibTorch implements it.

// The momentum buffer when momentum is set; nesterov's blend is one more temporary.
OptimizerMemory sgd_memory(const MemoryRuleInput& in) {
  const bool momentum = in.setting("momentum", 0) > 0;
  const bool nesterov = in.setting("nesterov", 0) > 0;
  return {momentum ? in.total() : 0, in.decay() + (nesterov ? in.largest() : 0)};
}

// exp_avg, exp_avg_sq (and max_exp_avg_sq); denom = sqrt(v) / c then + eps: two temporaries
// of the parameter's size at once. AdamW decays the parameter itself, not a gradient copy.
OptimizerMemory adam_like_memory(const MemoryRuleInput& in, bool decay_in_grad) {
  const bool amsgrad = in.setting("amsgrad", 0) > 0;
  return {(amsgrad ? 3 : 2) * in.total(), 2 * in.largest() + (decay_in_grad ? in.decay() : 0)};
}
OptimizerMemory adam_memory(const MemoryRuleInput& in) { return adam_like_memory(in, true); }
OptimizerMemory adamw_memory(const MemoryRuleInput& in) { return adam_like_memory(in, false); }

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
  e.memory = adam_memory;
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
  e.memory = adamw_memory;
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
