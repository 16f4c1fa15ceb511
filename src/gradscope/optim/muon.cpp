#include "gradscope/optim/muon.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>
#include <torch/optim/serialize.h>

#include "gradscope/core/error.h"
#include "gradscope/optim/factory.h"
#include "gradscope/optim/galore.h"
#include "gradscope/optim/state_key.h"

namespace gradscope {
namespace {

void check_muon_hyperparameters(const MuonOptions& o) {
  const auto [beta1, beta2] = o.adamw_betas();
  TORCH_CHECK(o.lr() >= 0, "Invalid learning rate: ", o.lr());
  TORCH_CHECK(o.momentum() >= 0 && o.momentum() < 1, "Invalid momentum value: ", o.momentum(),
              " (must lie in [0, 1))");
  TORCH_CHECK(o.ns_steps() >= 1, "Invalid ns_steps value: ", o.ns_steps(), " (must be >= 1)");
  TORCH_CHECK(o.weight_decay() >= 0, "Invalid weight_decay value: ", o.weight_decay());
  TORCH_CHECK(o.update_scale() == "reference" || o.update_scale() == "moonlight",
              "Invalid update_scale: '", o.update_scale(), "' (valid: reference, moonlight)");
  TORCH_CHECK(o.ns_dtype() == "bfloat16" || o.ns_dtype() == "float32", "Invalid ns_dtype: '",
              o.ns_dtype(), "' (valid: bfloat16, float32)");
  TORCH_CHECK(o.adamw_lr() >= 0, "Invalid adamw_lr value: ", o.adamw_lr());
  TORCH_CHECK(beta1 >= 0 && beta1 < 1, "Invalid adamw_betas parameter at index 0: ", beta1,
              " (must lie in [0, 1))");
  TORCH_CHECK(beta2 >= 0 && beta2 < 1, "Invalid adamw_betas parameter at index 1: ", beta2,
              " (must lie in [0, 1))");
  TORCH_CHECK(o.adamw_eps() >= 0, "Invalid adamw_eps value: ", o.adamw_eps());
}

}  // namespace

void MuonOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(nesterov);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(ns_steps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(update_scale);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(ns_dtype);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(use_muon);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(adamw_lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(adamw_betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(adamw_eps);
}

void MuonOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, momentum);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, nesterov);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, ns_steps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(std::string, update_scale);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(std::string, ns_dtype);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, use_muon);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, adamw_lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, adamw_betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, adamw_eps);
}

void MuonParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum_buffer);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
}

void MuonParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, momentum_buffer);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg_sq);
}

torch::Tensor newton_schulz5(const torch::Tensor& u, int64_t steps, torch::ScalarType dtype) {
  TORCH_CHECK(u.dim() == 2, "newton_schulz5 needs a matrix, got ", u.dim(), " dimensions");
  constexpr double a = 3.4445, b = -4.7750, c = 2.0315;
  const bool tall = u.size(0) > u.size(1);
  auto x = tall ? u.t().to(dtype) : u.to(dtype);  // (k, l), k <= l
  x = x / (x.norm() + 1e-7);                      // spectral norm at most 1
  for (int64_t i = 0; i < steps; ++i) {
    const auto gram = x.mm(x.t());                         // A: (k, k)
    const auto poly = gram.mul(b).add_(gram.mm(gram), c);  // b A + c A A
    x = poly.mm(x).add_(x, a);                             // a X + (b A + c A A) X
  }
  return tall ? x.t() : x;
}

double Muon::update_scale_for(const std::string& update_scale, int64_t rows, int64_t cols) {
  if (update_scale == "moonlight")
    return 0.2 * std::sqrt(static_cast<double>(std::max(rows, cols)));
  return std::sqrt(std::max(1.0, static_cast<double>(rows) / static_cast<double>(cols)));
}

Muon::Muon(std::vector<torch::optim::OptimizerParamGroup> param_groups, MuonOptions defaults)
    : SerializingOptimizer(std::move(param_groups), std::make_unique<MuonOptions>(defaults)) {
  check_muon_hyperparameters(defaults);
  for (const auto& group : param_groups_) {
    const auto& options = static_cast<const MuonOptions&>(group.options());
    check_muon_hyperparameters(options);
    if (!options.use_muon()) continue;
    for (const auto& p : group.params())
      TORCH_CHECK(p.dim() >= 2, "Muon needs parameters of at least 2 dimensions, got one of ",
                  p.sizes(), " (put it in a group with use_muon false)");
  }
}

torch::Tensor Muon::step(LossClosure closure) {
  const auto update_one = [](const MuonOptions& options, torch::Tensor& p, auto& slot) {
    const auto& grad = p.grad();
    if (!slot) {
      auto state = std::make_unique<MuonParamState>();
      if (options.use_muon()) {
        state->momentum_buffer(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      } else {
        state->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        state->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      }
      slot = std::move(state);
    }
    auto& state = static_cast<MuonParamState&>(*slot);
    state.step(state.step() + 1);

    if (options.use_muon()) {
      const double mu = options.momentum();
      auto& momentum = state.momentum_buffer();
      momentum.lerp_(grad, 1 - mu);
      const auto update = options.nesterov() ? grad.lerp(momentum, mu) : momentum;
      const int64_t rows = p.size(0), cols = p.numel() / rows;
      const auto dtype = options.ns_dtype() == "bfloat16"     ? torch::kBFloat16
                         : p.scalar_type() == torch::kFloat64 ? torch::kFloat64
                                                              : torch::kFloat32;
      const auto orthogonal =
          newton_schulz5(update.reshape({rows, cols}), options.ns_steps(), dtype);
      const double scale = update_scale_for(options.update_scale(), rows, cols);
      if (options.weight_decay() != 0) p.mul_(1 - options.lr() * options.weight_decay());
      p.add_(orthogonal.to(p.scalar_type()).view(p.sizes()), -options.lr() * scale);
      return;
    }
    // AdamW, as the reference's auxiliary Adam (lerp for both moments).
    const auto [beta1, beta2] = options.adamw_betas();
    auto& exp_avg = state.exp_avg();
    auto& exp_avg_sq = state.exp_avg_sq();
    exp_avg.lerp_(grad, 1 - beta1);
    exp_avg_sq.lerp_(grad.square(), 1 - beta2);
    const double bias_correction1 = 1 - std::pow(beta1, state.step());
    const double bias_correction2 = 1 - std::pow(beta2, state.step());
    const auto denom = (exp_avg_sq / bias_correction2).sqrt_().add_(options.adamw_eps());
    if (options.weight_decay() != 0) p.mul_(1 - options.adamw_lr() * options.weight_decay());
    p.addcdiv_(exp_avg, denom, -options.adamw_lr() / bias_correction1);
  };
  return step_each_parameter<MuonOptions>(*this, "Muon", closure, update_one);
}

namespace {

// A function-local static: the registry may be built during another file's static
// initialization.
const std::vector<std::string>& muon_keys() {
  static const std::vector<std::string> keys = {"momentum",     "nesterov",    "ns_steps",
                                                "adamw_lr",     "adamw_betas", "adamw_eps",
                                                "update_scale", "ns_dtype"};
  return keys;
}

std::unique_ptr<torch::optim::Optimizer> make_muon(std::vector<torch::Tensor> params,
                                                   const ParamInfo& info, double lr,
                                                   double weight_decay, const OptSettings& opt) {
  OptReader r("muon", opt, muon_keys());
  const double momentum = r.number("momentum", 0.95);
  const bool nesterov = r.flag("nesterov", true);
  const int64_t ns_steps = r.integer("ns_steps", 5);
  const auto update_scale = r.choice("update_scale", "reference", {"reference", "moonlight"});
  const auto ns_dtype = r.choice("ns_dtype", "bfloat16", {"bfloat16", "float32"});
  // Moonlight's scale matches AdamW's update RMS, so its AdamW parameters share the rate.
  const double adamw_lr = r.number("adamw_lr", update_scale == "moonlight" ? lr : 3e-4);
  const auto adamw_betas = r.pair("adamw_betas", {0.9, 0.95});
  const double adamw_eps = r.number("adamw_eps", 1e-10);
  check_range(momentum >= 0 && momentum < 1,
              fmt::format("muon momentum={} must lie in [0, 1)", momentum));
  check_range(ns_steps >= 1, fmt::format("muon ns_steps={} must be >= 1", ns_steps));
  check_range(adamw_lr > 0, fmt::format("muon adamw_lr={} must be > 0", adamw_lr));
  check_range(adamw_betas.first >= 0 && adamw_betas.first < 1 && adamw_betas.second >= 0 &&
                  adamw_betas.second < 1,
              fmt::format("muon adamw_betas={},{} must lie in [0, 1)", adamw_betas.first,
                          adamw_betas.second));
  check_range(adamw_eps >= 0, fmt::format("muon adamw_eps={} must be >= 0", adamw_eps));
  const auto& names = info.names;
  if (names.empty() && !params.empty())
    fail_runtime(
        "muon needs the parameters' names to tell the blocks' hidden matrices from "
        "embeddings, heads and classifiers",
        "build it with make_optimizer(name, params, names, ...) "
        "(torch::nn::Module::named_parameters())");
  const auto options = MuonOptions(lr)
                           .momentum(momentum)
                           .nesterov(nesterov)
                           .ns_steps(ns_steps)
                           .weight_decay(weight_decay)
                           .update_scale(update_scale)
                           .ns_dtype(ns_dtype)
                           .adamw_lr(adamw_lr)
                           .adamw_betas(std::make_tuple(adamw_betas.first, adamw_betas.second))
                           .adamw_eps(adamw_eps);

  std::vector<torch::Tensor> hidden, others;
  for (size_t i = 0; i < params.size(); ++i) {
    const bool matrix = params[i].dim() == 2 && galore_projects(names[i], galore_default_targets());
    (matrix ? hidden : others).push_back(params[i]);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!hidden.empty())
    groups.emplace_back(std::move(hidden), std::make_unique<MuonOptions>(options));
  if (!others.empty() || groups.empty())
    groups.emplace_back(std::move(others),
                        std::make_unique<MuonOptions>(MuonOptions(options).use_muon(false)));
  return construct_optimizer<Muon>("muon", std::move(groups), options);
}

// Momentum for the blocks' matrices, AdamW's two moments for the rest. An update of the
// largest matrix: its momentum blend, Newton-Schulz's iterates (about three of its size in
// bfloat16) and the orthogonalized update.
OptimizerMemory muon_memory(const MemoryRuleInput& in) {
  int64_t state = 0;
  for (const ParamExtent& p : in.params()) state += p.block_matrix ? p.bytes : 2 * p.bytes;
  return {state, std::max(2 * in.largest(), 4 * in.largest_matrix())};
}

}  // namespace

OptimizerEntry muon_entry() {
  OptimizerEntry e;
  e.make = make_muon;
  e.default_lr = 2e-2;
  e.keys = muon_keys();
  e.updates_block_matrices = true;
  e.memory = muon_memory;
  return e;
}

}  // namespace gradscope
