#include "gradscope/optim/adafactor.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <torch/optim/serialize.h>

#include "gradscope/optim/factory.h"
#include "gradscope/optim/state_key.h"

namespace gradscope {
namespace {

// ||A||_2 / sqrt(numel A), as a 0-dim tensor on A's device: reading it on the host would
// synchronize a GPU twice per parameter per step.
torch::Tensor rms(const torch::Tensor& a) {
  return a.norm().div_(std::sqrt(static_cast<double>(a.numel())));
}

}  // namespace

void AdafactorOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps1);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps2);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(clip_threshold);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(decay_rate);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(beta1);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(scale_parameter);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(relative_step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(warmup_init);
}

void AdafactorOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps1);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps2);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, clip_threshold);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, decay_rate);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG_OPTIONAL(double, beta1);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, scale_parameter);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, relative_step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, warmup_init);
}

void AdafactorParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq_row);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq_col);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
}

void AdafactorParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg_sq_row);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg_sq_col);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg_sq);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg);
}

Adafactor::Adafactor(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                     AdafactorOptions defaults)
    : SerializingOptimizer(std::move(param_groups), std::make_unique<AdafactorOptions>(defaults)) {
  TORCH_CHECK(defaults.lr() >= 0, "Invalid learning rate: ", defaults.lr());
  TORCH_CHECK(defaults.eps1() >= 0, "Invalid eps1 value: ", defaults.eps1());
  TORCH_CHECK(defaults.eps2() >= 0, "Invalid eps2 value: ", defaults.eps2());
  TORCH_CHECK(defaults.clip_threshold() > 0,
              "Invalid clip_threshold value: ", defaults.clip_threshold(), " (must be > 0)");
  TORCH_CHECK(defaults.decay_rate() >= -1 && defaults.decay_rate() < 0,
              "Invalid decay_rate value: ", defaults.decay_rate(), " (must lie in [-1, 0))");
  if (defaults.beta1()) {
    TORCH_CHECK(*defaults.beta1() >= 0 && *defaults.beta1() < 1,
                "Invalid beta1 value: ", *defaults.beta1(), " (must lie in [0, 1))");
  }
  TORCH_CHECK(defaults.weight_decay() >= 0,
              "Invalid weight_decay value: ", defaults.weight_decay());
  TORCH_CHECK(!defaults.warmup_init() || defaults.relative_step(),
              "warmup_init=true needs relative_step=true");
}

torch::Tensor Adafactor::step(LossClosure closure) {
  const auto update_one = [](const AdafactorOptions& options, torch::Tensor& p, auto& slot) {
    const auto& grad = p.grad();
    const bool factored = grad.dim() >= 2;
    if (!slot) {
      auto state = std::make_unique<AdafactorParamState>();
      if (factored) {
        auto row_shape = grad.sizes().vec();  // shape[:-1]
        row_shape.pop_back();
        auto col_shape = grad.sizes().vec();  // shape[:-2] + shape[-1:]
        col_shape.erase(col_shape.end() - 2);
        state->exp_avg_sq_row(torch::zeros(row_shape, grad.options()));
        state->exp_avg_sq_col(torch::zeros(col_shape, grad.options()));
      } else {
        state->exp_avg_sq(torch::zeros_like(grad, torch::MemoryFormat::Preserve));
      }
      if (options.beta1()) {
        state->exp_avg(torch::zeros_like(grad, torch::MemoryFormat::Preserve));
      }
      slot = std::move(state);
    }
    auto& state = static_cast<AdafactorParamState&>(*slot);
    state.step(state.step() + 1);
    const double t = static_cast<double>(state.step());

    double rho_t = options.lr();
    if (options.relative_step()) {
      const double cap = options.warmup_init() ? 1e-6 * t : options.lr();
      rho_t = std::min(cap, 1.0 / std::sqrt(t));
    }
    // alpha_t, a 0-dim tensor when it depends on RMS(X) (taken before X changes).
    const torch::Tensor alpha_t = options.scale_parameter()
                                      ? rms(p).clamp_min_(options.eps2()).mul_(rho_t)
                                      : torch::scalar_tensor(rho_t, p.options());
    const double beta2_t = 1.0 - std::pow(t, options.decay_rate());

    auto update = grad.square().add_(options.eps1());  // G^2 + eps1
    if (factored) {
      auto& row = state.exp_avg_sq_row();  // (..., n)
      auto& col = state.exp_avg_sq_col();  // (..., m)
      row.mul_(beta2_t).add_(update.mean(-1), 1.0 - beta2_t);
      col.mul_(beta2_t).add_(update.mean(-2), 1.0 - beta2_t);
      auto r_factor =
          (row / row.mean(-1, /*keepdim=*/true)).rsqrt_().unsqueeze(-1);  // (..., n, 1)
      auto c_factor = col.unsqueeze(-2).rsqrt();                          // (..., 1, m)
      update = r_factor.mul(c_factor).mul_(grad);
    } else {
      auto& v = state.exp_avg_sq();
      v.mul_(beta2_t).add_(update, 1.0 - beta2_t);
      update = v.rsqrt().mul_(grad);
    }
    update.div_(rms(update).div_(options.clip_threshold()).clamp_min_(1.0));
    update.mul_(alpha_t);
    if (options.beta1()) {
      const double beta1 = *options.beta1();
      state.exp_avg().mul_(beta1).add_(update, 1.0 - beta1);
      update = state.exp_avg();
    }
    if (options.weight_decay() != 0) p.mul_(alpha_t.mul(-options.weight_decay()).add_(1));
    p.sub_(update);
  };
  return step_each_parameter<AdafactorOptions>(*this, "Adafactor", closure, update_one);
}

namespace {

// A function-local static: the registry may be built during another file's static
// initialization.
const std::vector<std::string>& adafactor_keys() {
  static const std::vector<std::string> keys = {
      "beta1", "decay_rate", "clip_threshold", "eps", "relative_step", "scale_parameter",
      "warmup_init"};
  return keys;
}

std::unique_ptr<torch::optim::Optimizer> make_adafactor(std::vector<torch::Tensor> params,
                                                        const ParamInfo& /*info*/, double lr,
                                                        double weight_decay,
                                                        const OptSettings& opt) {
  OptReader r("adafactor", opt, adafactor_keys());
  const auto beta1 = r.maybe_number("beta1");
  const double decay_rate = r.number("decay_rate", -0.8);
  const double clip_threshold = r.number("clip_threshold", 1.0);
  const auto eps = r.pair("eps", {1e-30, 1e-3});
  const bool relative_step = r.flag("relative_step", true);
  const bool warmup_init = r.flag("warmup_init", false);
  check_range(!beta1 || (*beta1 >= 0 && *beta1 < 1),
              fmt::format("adafactor beta1={} must lie in [0, 1)", beta1.value_or(0)));
  check_range(decay_rate >= -1 && decay_rate < 0,
              fmt::format("adafactor decay_rate={} must lie in [-1, 0)", decay_rate));
  check_range(clip_threshold > 0,
              fmt::format("adafactor clip_threshold={} must be > 0", clip_threshold));
  check_range(eps.first >= 0 && eps.second >= 0,
              fmt::format("adafactor eps={},{} must be >= 0", eps.first, eps.second));
  check_range(!warmup_init || relative_step, "adafactor warmup_init=true needs relative_step=true");
  auto options = AdafactorOptions(lr)
                     .eps1(eps.first)
                     .eps2(eps.second)
                     .clip_threshold(clip_threshold)
                     .decay_rate(decay_rate)
                     .beta1(beta1 ? c10::optional<double>(*beta1) : c10::nullopt)
                     .weight_decay(weight_decay)
                     .scale_parameter(r.flag("scale_parameter", true))
                     .relative_step(relative_step)
                     .warmup_init(warmup_init);
  return construct_optimizer<Adafactor>("adafactor", std::move(params), options);
}

}  // namespace

OptimizerEntry adafactor_entry() {
  OptimizerEntry e;
  e.make = make_adafactor;
  e.default_lr = 1e-2;
  e.keys = adafactor_keys();
  e.lr_by_model = toy_learning_rates(1e-1);
  e.no_memory_model =
      "its factored second moment follows each parameter's whole shape (a row and a column "
      "statistic per matrix, every dimension of larger tensors), which is not modelled";
  return e;
}

}  // namespace gradscope
