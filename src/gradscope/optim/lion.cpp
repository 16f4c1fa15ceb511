#include "gradscope/optim/lion.h"

#include <fmt/format.h>
#include <torch/optim/serialize.h>

#include "gradscope/optim/factory.h"
#include "gradscope/optim/state_key.h"

namespace gradscope {

void LionOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
}

void LionOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
}

void LionParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
}

void LionParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg);
}

Lion::Lion(std::vector<torch::optim::OptimizerParamGroup> param_groups, LionOptions defaults)
    : SerializingOptimizer(std::move(param_groups), std::make_unique<LionOptions>(defaults)) {
  const auto [beta1, beta2] = defaults.betas();
  TORCH_CHECK(defaults.lr() >= 0, "Invalid learning rate: ", defaults.lr());
  TORCH_CHECK(beta1 >= 0 && beta1 < 1, "Invalid beta parameter at index 0: ", beta1,
              " (must lie in [0, 1))");
  TORCH_CHECK(beta2 >= 0 && beta2 < 1, "Invalid beta parameter at index 1: ", beta2,
              " (must lie in [0, 1))");
  TORCH_CHECK(defaults.weight_decay() >= 0,
              "Invalid weight_decay value: ", defaults.weight_decay());
}

torch::Tensor Lion::step(LossClosure closure) {
  return step_each_parameter<LionOptions>(
      *this, "Lion", closure, [](const LionOptions& options, torch::Tensor& p, auto& slot) {
        const auto [beta1, beta2] = options.betas();
        if (!slot) {
          auto state = std::make_unique<LionParamState>();
          state->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
          slot = std::move(state);
        }
        auto& exp_avg = static_cast<LionParamState&>(*slot).exp_avg();
        const auto& grad = p.grad();
        if (options.weight_decay() != 0) p.mul_(1 - options.lr() * options.weight_decay());
        auto update = exp_avg.mul(beta1).add_(grad, 1 - beta1).sign_();  // (same shape as p)
        p.add_(update, -options.lr());
        exp_avg.mul_(beta2).add_(grad, 1 - beta2);
      });
}

namespace {

// A function-local static: the registry may be built during another file's static
// initialization.
const std::vector<std::string>& lion_keys() {
  static const std::vector<std::string> keys = {"betas"};
  return keys;
}

std::unique_ptr<torch::optim::Optimizer> make_lion(std::vector<torch::Tensor> params,
                                                   const ParamInfo& /*info*/, double lr,
                                                   double weight_decay, const OptSettings& opt) {
  OptReader r("lion", opt, lion_keys());
  const auto betas = r.pair("betas", {0.9, 0.99});
  check_betas("lion", betas);
  auto options =
      LionOptions(lr).betas(std::make_tuple(betas.first, betas.second)).weight_decay(weight_decay);
  return construct_optimizer<Lion>("lion", std::move(params), options);
}

// momentum; the sign of the blend.
OptimizerMemory lion_memory(const MemoryRuleInput& in) { return {in.total(), in.largest()}; }

}  // namespace

OptimizerEntry lion_entry() {
  OptimizerEntry e;
  e.make = make_lion;
  e.default_lr = 1e-4;
  e.keys = lion_keys();
  e.lr_by_model = toy_learning_rates(1e-2);
  e.elementwise = true;
  e.memory = lion_memory;
  e.compared_in_estimate = true;
  return e;
}

}  // namespace gradscope
