#include "gradscope/optim/adadelta.h"

#include <fmt/format.h>
#include <torch/optim/serialize.h>

#include "gradscope/optim/factory.h"
#include "gradscope/optim/state_key.h"

namespace gradscope {

void AdadeltaOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(rho);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(maximize);
}

void AdadeltaOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, rho);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, maximize);
}

void AdadeltaParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(square_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(acc_delta);
}

void AdadeltaParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, square_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, acc_delta);
}

Adadelta::Adadelta(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                   AdadeltaOptions defaults)
    : SerializingOptimizer(std::move(param_groups), std::make_unique<AdadeltaOptions>(defaults)) {
  TORCH_CHECK(defaults.lr() >= 0, "Invalid learning rate: ", defaults.lr());
  TORCH_CHECK(defaults.rho() >= 0 && defaults.rho() <= 1, "Invalid rho value: ", defaults.rho(),
              " (must lie in [0, 1])");
  TORCH_CHECK(defaults.eps() >= 0, "Invalid epsilon value: ", defaults.eps());
  TORCH_CHECK(defaults.weight_decay() >= 0,
              "Invalid weight_decay value: ", defaults.weight_decay());
}

torch::Tensor Adadelta::step(LossClosure closure) {
  return step_each_parameter<AdadeltaOptions>(
      *this, "Adadelta", closure,
      [](const AdadeltaOptions& options, torch::Tensor& p, auto& slot) {
        auto grad = options.maximize() ? -p.grad() : p.grad();
        if (!slot) {
          auto state = std::make_unique<AdadeltaParamState>();
          state->square_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
          state->acc_delta(torch::zeros_like(p, torch::MemoryFormat::Preserve));
          slot = std::move(state);
        }
        auto& state = static_cast<AdadeltaParamState&>(*slot);
        state.step(state.step() + 1);
        if (options.weight_decay() != 0) grad = grad.add(p, options.weight_decay());

        const double rho = options.rho();
        auto& square_avg = state.square_avg();
        auto& acc_delta = state.acc_delta();
        square_avg.mul_(rho).addcmul_(grad, grad, 1 - rho);
        auto std = square_avg.add(options.eps()).sqrt_();
        auto delta = acc_delta.add(options.eps()).sqrt_().div_(std).mul_(grad);
        acc_delta.mul_(rho).addcmul_(delta, delta, 1 - rho);
        p.add_(delta, -options.lr());
      });
}

namespace {

// A function-local static: the registry may be built during another file's static
// initialization.
const std::vector<std::string>& adadelta_keys() {
  static const std::vector<std::string> keys = {"rho", "eps", "maximize"};
  return keys;
}

std::unique_ptr<torch::optim::Optimizer> make_adadelta(std::vector<torch::Tensor> params,
                                                       const ParamInfo& /*info*/, double lr,
                                                       double weight_decay,
                                                       const OptSettings& opt) {
  OptReader r("adadelta", opt, adadelta_keys());
  const double rho = r.number("rho", 0.9);
  const double eps = r.number("eps", 1e-6);
  check_range(rho >= 0 && rho <= 1, fmt::format("adadelta rho={} must lie in [0, 1]", rho));
  check_range(eps >= 0, fmt::format("adadelta eps={} must be >= 0", eps));
  auto options = AdadeltaOptions(lr)
                     .rho(rho)
                     .eps(eps)
                     .weight_decay(weight_decay)
                     .maximize(r.flag("maximize", false));
  return construct_optimizer<Adadelta>("adadelta", std::move(params), options);
}

// square_avg, acc_delta; the update's delta and its denominator.
OptimizerMemory adadelta_memory(const MemoryRuleInput& in) {
  return {2 * in.total(), 2 * in.largest() + in.decay()};
}

}  // namespace

OptimizerEntry adadelta_entry() {
  OptimizerEntry e;
  e.make = make_adadelta;
  e.default_lr = 1.0;
  e.keys = adadelta_keys();
  e.steps_in_backward = true;
  e.elementwise = true;
  e.memory = adadelta_memory;
  e.compared_in_estimate = true;
  return e;
}

}  // namespace gradscope
