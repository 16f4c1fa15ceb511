#include "gradscope/optim/apollo.h"

#include <algorithm>
#include <cmath>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/serialize.h>

#include "gradscope/core/error.h"
#include "gradscope/core/rng.h"
#include "gradscope/optim/factory.h"
#include "gradscope/optim/galore.h"
#include "gradscope/optim/low_rank.h"
#include "gradscope/optim/state_key.h"

namespace gradscope {
namespace {

// The norm-growth limiter's gamma and the guard of its ratio and of the scaling factor's
// denominator, as in the reference code.
constexpr double kApolloGamma = 1.01;
constexpr double kApolloTiny = 1e-8;

// The hyperparameters that do not depend on the parameters.
void check_apollo_hyperparameters(const ApolloOptions& o) {
  const auto [beta1, beta2] = o.betas();
  TORCH_CHECK(o.lr() >= 0, "Invalid learning rate: ", o.lr());
  TORCH_CHECK(beta1 >= 0 && beta1 < 1, "Invalid beta parameter at index 0: ", beta1,
              " (must lie in [0, 1))");
  TORCH_CHECK(beta2 >= 0 && beta2 < 1, "Invalid beta parameter at index 1: ", beta2,
              " (must lie in [0, 1))");
  TORCH_CHECK(o.eps() >= 0, "Invalid epsilon value: ", o.eps());
  TORCH_CHECK(o.weight_decay() >= 0, "Invalid weight_decay value: ", o.weight_decay());
  TORCH_CHECK(o.update_proj_gap() >= 1, "Invalid update_proj_gap value: ", o.update_proj_gap(),
              " (must be >= 1)");
  TORCH_CHECK(o.scale() > 0, "Invalid scale value: ", o.scale(), " (must be > 0)");
  TORCH_CHECK(o.seed() >= 0, "Invalid seed value: ", o.seed(), " (must be >= 0)");
  if (o.rank()) {
    TORCH_CHECK(*o.rank() >= 1, "Invalid rank value: ", *o.rank(), " (must be >= 1)");
  }
}

}  // namespace

void ApolloOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(rank);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(update_proj_gap);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(scale);
  archive.write("scale_type", c10::IValue(static_cast<int64_t>(scale_type())));
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(seed);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(limiter);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(project);
}

void ApolloOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG_OPTIONAL(int64_t, rank);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, update_proj_gap);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, scale);
  c10::IValue type;
  archive.read("scale_type", type);
  const int64_t value = type.toInt();
  TORCH_CHECK(value == static_cast<int64_t>(ApolloScaleType::kChannel) ||
                  value == static_cast<int64_t>(ApolloScaleType::kTensor),
              "Invalid scale_type in a saved APOLLO state: ", value);
  scale_type(static_cast<ApolloScaleType>(value));
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, seed);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, limiter);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, project);
}

void ApolloParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(update_norm);
}

void ApolloParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg_sq);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, update_norm);
}

torch::Tensor apollo_projection(int64_t seed, int64_t index, int64_t draw, int64_t rows,
                                int64_t cols, int64_t rank, const torch::TensorOptions& options) {
  TORCH_CHECK(seed >= 0 && index >= 0 && draw >= 0 && rank >= 1,
              "apollo_projection: seed, index and draw must be >= 0 and rank >= 1");
  auto generator = at::detail::createCPUGenerator(hash3(
      static_cast<uint64_t>(seed), static_cast<uint64_t>(index), static_cast<uint64_t>(draw)));
  const auto shape = projects_on_left(rows, cols)
                         ? std::vector<int64_t>{rows, rank}   // (m, r): R = P^T G
                         : std::vector<int64_t>{rank, cols};  // (r, n): R = G P^T
  auto p = torch::randn(shape, generator, torch::dtype(torch::kFloat32));
  p.div_(std::sqrt(static_cast<double>(rank)));
  return p.to(options);
}

int64_t Apollo::rank_for(const ApolloOptions& options, int64_t rows, int64_t cols) {
  if (options.rank()) return *options.rank();
  return std::max<int64_t>(1, std::min(rows, cols) / 4);
}

torch::Tensor Apollo::projection(const ApolloOptions& options, const torch::Tensor& param,
                                 int64_t index, int64_t draw, int64_t rank) const {
  return apollo_projection(options.seed(), index, draw, param.size(0), param.size(1), rank,
                           param.options());
}

Apollo::Apollo(std::vector<torch::optim::OptimizerParamGroup> param_groups, ApolloOptions defaults)
    : SerializingOptimizer(std::move(param_groups), std::make_unique<ApolloOptions>(defaults)) {
  check_apollo_hyperparameters(defaults);
  check_low_rank_groups<ApolloOptions>(param_groups_, check_apollo_hyperparameters);
}

torch::Tensor Apollo::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss = {};
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  int64_t index = -1;  // the parameter's position among all groups' parameters: P's seed
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const ApolloOptions&>(group.options());
    const auto [beta1, beta2] = options.betas();
    for (auto& p : group.params()) {
      ++index;
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), "APOLLO does not support sparse gradients");
      bool left = false;
      ApolloParamState* const projected = begin_low_rank_step<ApolloParamState>(
          options, p, state_[param_state_key(p)], left, &Apollo::rank_for);
      if (projected == nullptr) continue;  // stepped as AdamW
      ApolloParamState& state = *projected;
      const auto& grad = p.grad();
      auto& exp_avg = state.exp_avg();
      auto& exp_avg_sq = state.exp_avg_sq();
      const double bias_correction1 = 1 - std::pow(beta1, state.step());
      const double bias_correction2 = 1 - std::pow(beta2, state.step());
      // The rank comes from the moments, so a loaded state keeps the rank it was saved with.
      const int64_t r = left ? exp_avg.size(0) : exp_avg.size(1);
      const int64_t draw = (state.step() - 1) / options.update_proj_gap();
      const auto proj = projection(options, p, index, draw, r);       // (m, r) or (r, n)
      const auto low = left ? proj.t().mm(grad) : grad.mm(proj.t());  // R: (r, n) or (m, r)
      exp_avg.mul_(beta1).add_(low, 1 - beta1);
      exp_avg_sq.mul_(beta2).addcmul_(low, low, 1 - beta2);
      const auto normalized = exp_avg / exp_avg_sq.sqrt().add_(options.eps());  // N: R's shape
      torch::Tensor factor;
      if (options.scale_type() == ApolloScaleType::kChannel) {
        // Over the r sketch coordinates of each channel: (1, n) for columns, (m, 1) for rows,
        // so the factor broadcasts over G.
        const int64_t dim = left ? 0 : 1;
        const c10::IntArrayRef dims(dim);
        factor = normalized.norm(2, dims, /*keepdim=*/true)
                     .div_(low.norm(2, dims, /*keepdim=*/true).add_(kApolloTiny));
      } else {
        factor = normalized.norm().div_(low.norm().add_(kApolloTiny));
      }
      auto update = grad * factor;  // U: (m, n)
      if (options.limiter()) {
        // Tensors throughout, so that no step waits for the device to learn a norm.
        auto norm = update.norm();
        if (state.update_norm().defined()) {
          const auto limit = (norm / (state.update_norm() + kApolloTiny))
                                 .clamp_min_(kApolloGamma)
                                 .div_(kApolloGamma);
          update.div_(limit);
          norm.div_(limit);
        }
        state.update_norm(norm);
      }
      const double step_size = options.lr() * std::sqrt(bias_correction2) / bias_correction1 *
                               std::sqrt(options.scale());
      p.add_(update, -step_size);
    }
  }
  return loss;
}

// ---------------------------------------------------------------------- the registry's builders

namespace {

// Function-local statics: the registry may be built during another file's static
// initialization.
const std::vector<std::string>& apollo_keys() {
  static const std::vector<std::string> keys = {"rank",   "update_proj_gap", "scale", "scale_type",
                                                "seed",   "limiter",         "betas", "eps",
                                                "targets"};
  return keys;
}

const std::vector<std::string>& apollo_mini_keys() {
  static const std::vector<std::string> keys = {"update_proj_gap", "scale", "seed",   "limiter",
                                                "betas",           "eps",   "targets"};
  return keys;
}

// rank, update_proj_gap and seed are whole numbers read as numbers, so that rank=1.5 is refused
// naming it. The matrices galore_projects picks form a projecting group, every other parameter
// a group with project=false (AdamW), as in the reference code.
std::unique_ptr<torch::optim::Optimizer> build_apollo(const std::string& name, bool mini,
                                                      std::vector<torch::Tensor> params,
                                                      const ParamInfo& info, double lr,
                                                      double weight_decay, const OptSettings& opt) {
  OptReader r(name, opt, mini ? apollo_mini_keys() : apollo_keys());
  const auto rank = mini ? std::optional<double>(1) : r.maybe_number("rank");  // unset: min/4
  const double update_proj_gap = r.number("update_proj_gap", 200);
  const double scale = r.number("scale", mini ? 128 : 1);
  const auto scale_type =
      mini ? std::string("tensor") : r.choice("scale_type", "channel", {"channel", "tensor"});
  const double seed = r.number("seed", 0);
  const bool limiter = r.flag("limiter", true);
  const auto betas = r.pair("betas", {0.9, 0.999});
  const double eps = r.number("eps", 1e-6);
  const auto targets = r.names("targets", galore_default_targets());
  auto whole = [](double v, double least) {
    return v >= least && v <= 9.0e15 && v == std::floor(v);
  };
  check_range(!rank || whole(*rank, 1),
              fmt::format("{} rank={} must be a positive integer (leave it unset for "
                          "min(m, n) / 4 per matrix)",
                          name, rank.value_or(0)));
  check_range(
      whole(update_proj_gap, 1),
      fmt::format("{} update_proj_gap={} must be a positive integer", name, update_proj_gap));
  check_range(scale > 0, fmt::format("{} scale={} must be > 0", name, scale));
  check_range(whole(seed, 0), fmt::format("{} seed={} must be an integer >= 0", name, seed));
  check_betas(name, betas);
  check_range(eps >= 0, fmt::format("{} eps={} must be >= 0", name, eps));
  const auto& names = info.names;
  require_param_names(name, names, params);
  auto options = ApolloOptions(lr)
                     .betas(std::make_tuple(betas.first, betas.second))
                     .eps(eps)
                     .weight_decay(weight_decay)
                     .update_proj_gap(static_cast<int64_t>(update_proj_gap))
                     .scale(scale)
                     .scale_type(scale_type == "tensor" ? ApolloScaleType::kTensor
                                                        : ApolloScaleType::kChannel)
                     .seed(static_cast<int64_t>(seed))
                     .limiter(limiter);
  if (rank) options.rank(static_cast<int64_t>(*rank));

  auto groups = projection_groups(name, params, names, targets, opt, options);
  // A rank above min(m, n) of some matrix is refused by the constructor: a usage error here.
  return construct_optimizer<Apollo>(name, std::move(groups), options);
}

std::unique_ptr<torch::optim::Optimizer> make_apollo(std::vector<torch::Tensor> params,
                                                     const ParamInfo& info, double lr,
                                                     double weight_decay, const OptSettings& opt) {
  return build_apollo("apollo", /*mini=*/false, std::move(params), info, lr, weight_decay, opt);
}

std::unique_ptr<torch::optim::Optimizer> make_apollo_mini(std::vector<torch::Tensor> params,
                                                          const ParamInfo& info, double lr,
                                                          double weight_decay,
                                                          const OptSettings& opt) {
  return build_apollo("apollo-mini", /*mini=*/true, std::move(params), info, lr, weight_decay, opt);
}

// Moments in a rank-r space for the blocks' matrices (apollo-mini: rank 1) and one float for
// the norm limiter, AdamW's elsewhere; the projection is drawn again each step, not kept.
OptimizerMemory apollo_memory(const MemoryRuleInput& in) {
  return projected_moments_memory(in, in.setting("rank", 0), /*keeps_projector=*/false);
}
OptimizerMemory apollo_mini_memory(const MemoryRuleInput& in) {
  return projected_moments_memory(in, 1.0, /*keeps_projector=*/false);
}

}  // namespace

OptimizerEntry apollo_entry() {
  OptimizerEntry e;
  e.make = make_apollo;
  e.default_lr = 1e-2;
  e.keys = apollo_keys();
  e.lr_by_model = toy_learning_rates(1e-1);
  e.updates_block_matrices = true;
  e.memory = apollo_memory;
  return e;
}

OptimizerEntry apollo_mini_entry() {
  OptimizerEntry e;
  e.make = make_apollo_mini;
  e.default_lr = 1e-2;
  e.keys = apollo_mini_keys();
  e.lr_by_model = toy_learning_rates(1e-1);
  e.updates_block_matrices = true;
  e.memory = apollo_mini_memory;
  return e;
}

}  // namespace gradscope
