#include "gradscope/optim/lion.h"

#include <torch/optim/serialize.h>

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

}  // namespace gradscope
