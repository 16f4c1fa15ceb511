#include "gradscope/optim/galore.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <torch/optim/serialize.h>

#include "gradscope/optim/factory.h"
#include "gradscope/optim/low_rank.h"
#include "gradscope/optim/state_key.h"

namespace gradscope {
namespace {

// The hyperparameters that do not depend on the parameters.
void check_hyperparameters(const GaloreOptions& o) {
  const auto [beta1, beta2] = o.betas();
  TORCH_CHECK(o.lr() >= 0, "Invalid learning rate: ", o.lr());
  TORCH_CHECK(beta1 >= 0 && beta1 < 1, "Invalid beta parameter at index 0: ", beta1,
              " (must lie in [0, 1))");
  TORCH_CHECK(beta2 >= 0 && beta2 < 1, "Invalid beta parameter at index 1: ", beta2,
              " (must lie in [0, 1))");
  TORCH_CHECK(o.eps() >= 0, "Invalid epsilon value: ", o.eps());
  TORCH_CHECK(o.weight_decay() >= 0, "Invalid weight_decay value: ", o.weight_decay());
  TORCH_CHECK(o.update_gap() >= 1, "Invalid update_gap value: ", o.update_gap(), " (must be >= 1)");
  TORCH_CHECK(o.scale() > 0, "Invalid scale value: ", o.scale(), " (must be > 0)");
  if (o.rank()) {
    TORCH_CHECK(*o.rank() >= 1, "Invalid rank value: ", *o.rank(), " (must be >= 1)");
  }
}

// The first r singular vectors of G (m, n) on the side projects_on_left picks: (m, r) left
// ones when m < n, else (n, r) right ones. The SVD runs in float32 (float64 for float64 gradients)
// and the projector is returned in the gradient's dtype.
torch::Tensor projector_of(const torch::Tensor& grad, int64_t r) {
  const auto svd_dtype = grad.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  const auto [u, s, vh] = torch::linalg_svd(grad.to(svd_dtype), /*full_matrices=*/false);
  // u: (m, k), vh: (k, n), k = min(m, n)
  const auto p = projects_on_left(grad.size(0), grad.size(1)) ? u.narrow(1, 0, r)
                                                              : vh.narrow(0, 0, r).t();
  // A copy in any case: a view would keep all of U or V^T alive (k x k values, not r x k).
  return p.to(grad.options(), /*non_blocking=*/false, /*copy=*/true,
              torch::MemoryFormat::Contiguous);
}

}  // namespace

void GaloreOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(rank);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(update_gap);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(scale);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(project);
}

void GaloreOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG_OPTIONAL(int64_t, rank);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, update_gap);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, scale);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, project);
}

void GaloreParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(projector);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
}

void GaloreParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, projector);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg_sq);
}

const std::vector<std::string>& galore_default_targets() {
  static const std::vector<std::string> targets = {"q_proj",    "k_proj",  "v_proj",    "o_proj",
                                                   "gate_proj", "up_proj", "down_proj", "fc1",
                                                   "fc2",       "Wi",      "Wo"};
  return targets;
}

bool galore_projects(const std::string& name, const std::vector<std::string>& targets) {
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t dot = name.find('.', start);
    parts.push_back(name.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (parts.back() != "weight") return false;
  auto is_index = [](const std::string& s) {
    return !s.empty() &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (parts[i] != "layers" || !is_index(parts[i + 1])) continue;
    // The modules between the block and the weight: self_attn, q_proj; mlp, fc1; ...
    for (size_t j = i + 2; j + 1 < parts.size(); ++j)
      if (std::find(targets.begin(), targets.end(), parts[j]) != targets.end()) return true;
  }
  return false;
}

int64_t Galore::rank_for(const GaloreOptions& options, int64_t rows, int64_t cols) {
  if (options.rank()) return *options.rank();
  return std::max<int64_t>(1, std::min(rows, cols) / 4);
}

Galore::Galore(std::vector<torch::optim::OptimizerParamGroup> param_groups, GaloreOptions defaults)
    : SerializingOptimizer(std::move(param_groups), std::make_unique<GaloreOptions>(defaults)) {
  check_hyperparameters(defaults);
  check_low_rank_groups<GaloreOptions>(param_groups_, check_hyperparameters);
}

torch::Tensor Galore::step(LossClosure closure) {
  const auto update_one = [](const GaloreOptions& options, torch::Tensor& p, auto& slot) {
    bool left = false;
    GaloreParamState* const projected =
        begin_low_rank_step<GaloreParamState>(options, p, slot, left, &Galore::rank_for);
    if (projected == nullptr) return;  // stepped as AdamW
    GaloreParamState& state = *projected;
    const auto [beta1, beta2] = options.betas();
    const auto& grad = p.grad();
    auto& exp_avg = state.exp_avg();
    auto& exp_avg_sq = state.exp_avg_sq();
    const double bias_correction1 = 1 - std::pow(beta1, state.step());
    const double bias_correction2 = 1 - std::pow(beta2, state.step());
    // The rank comes from the moments, so a loaded state keeps the rank it was saved with.
    const int64_t r = left ? exp_avg.size(0) : exp_avg.size(1);
    if ((state.step() - 1) % options.update_gap() == 0) state.projector(projector_of(grad, r));
    const auto& proj = state.projector();                       // (m, r) if left, else (n, r)
    const auto low = left ? proj.t().mm(grad) : grad.mm(proj);  // R: (r, n) or (m, r)
    exp_avg.mul_(beta1).add_(low, 1 - beta1);
    exp_avg_sq.mul_(beta2).addcmul_(low, low, 1 - beta2);
    auto denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(options.eps());
    const auto normalized = exp_avg.div(denom).div_(bias_correction1);         // N: R's shape
    const auto update = left ? proj.mm(normalized) : normalized.mm(proj.t());  // (m, n)
    p.add_(update, -options.lr() * options.scale());
  };
  return step_each_parameter<GaloreOptions>(*this, "GaLore", closure, update_one);
}

namespace {

// A function-local static: the registry may be built during another file's static
// initialization.
const std::vector<std::string>& galore_keys() {
  static const std::vector<std::string> keys = {
      "rank", "update_gap", "scale", "betas", "eps", "targets"};
  return keys;
}

// rank and update_gap are integers read as numbers, so that rank=1.5 is refused naming it.
// The matrices the paper projects (galore_projects, by name) form a projecting group, every
// other parameter a group with project=false (AdamW), as in GaLore's reference code.
std::unique_ptr<torch::optim::Optimizer> make_galore(std::vector<torch::Tensor> params,
                                                     const ParamInfo& info, double lr,
                                                     double weight_decay, const OptSettings& opt) {
  OptReader r("galore", opt, galore_keys());
  const auto rank = r.maybe_number("rank");  // unset: max(1, min(m, n) / 4) per matrix
  const double update_gap = r.number("update_gap", 200);
  const double scale = r.number("scale", 0.25);
  const auto betas = r.pair("betas", {0.9, 0.999});
  const double eps = r.number("eps", 1e-8);
  const auto targets = r.names("targets", galore_default_targets());
  auto positive_integer = [](double v) { return v >= 1 && v <= 9.0e15 && v == std::floor(v); };
  check_range(!rank || positive_integer(*rank),
              fmt::format("galore rank={} must be a positive integer (leave it unset for "
                          "min(m, n) / 4 per matrix)",
                          rank.value_or(0)));
  check_range(positive_integer(update_gap),
              fmt::format("galore update_gap={} must be a positive integer", update_gap));
  check_range(scale > 0, fmt::format("galore scale={} must be > 0", scale));
  check_betas("galore", betas);
  check_range(eps >= 0, fmt::format("galore eps={} must be >= 0", eps));
  const auto& names = info.names;
  require_param_names("galore", names, params);
  auto options = GaloreOptions(lr)
                     .betas(std::make_tuple(betas.first, betas.second))
                     .eps(eps)
                     .weight_decay(weight_decay)
                     .update_gap(static_cast<int64_t>(update_gap))
                     .scale(scale);
  if (rank) options.rank(static_cast<int64_t>(*rank));

  auto groups = projection_groups(std::string("galore"), params, names, targets, opt, options);
  // A rank above min(m, n) of some matrix is refused by the constructor: a usage error here.
  return construct_optimizer<Galore>("galore", std::move(groups), options);
}

// Moments in a rank-r space and the projector for the blocks' matrices, AdamW's elsewhere.
OptimizerMemory galore_memory(const MemoryRuleInput& in) {
  return projected_moments_memory(in, in.setting("rank", 0), /*keeps_projector=*/true);
}

}  // namespace

OptimizerEntry galore_entry() {
  OptimizerEntry e;
  e.make = make_galore;
  e.default_lr = 1e-2;
  e.keys = galore_keys();
  e.lr_by_model = toy_learning_rates(1e-1);
  e.updates_block_matrices = true;
  e.memory = galore_memory;
  return e;
}

}  // namespace gradscope
