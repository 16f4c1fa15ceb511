#include "gradscope/optim/adam_mini.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>
#include <sstream>
#include <utility>

#include <fmt/format.h>
#include <torch/optim/serialize.h>

#include "gradscope/core/error.h"
#include "gradscope/optim/factory.h"
#include "gradscope/optim/state_key.h"

namespace gradscope {
namespace {

void check_adam_mini_hyperparameters(const AdamMiniOptions& o) {
  const auto [beta1, beta2] = o.betas();
  TORCH_CHECK(o.lr() >= 0, "Invalid learning rate: ", o.lr());
  TORCH_CHECK(beta1 >= 0 && beta1 < 1, "Invalid beta parameter at index 0: ", beta1,
              " (must lie in [0, 1))");
  TORCH_CHECK(beta2 >= 0 && beta2 < 1, "Invalid beta parameter at index 1: ", beta2,
              " (must lie in [0, 1))");
  TORCH_CHECK(o.eps() >= 0, "Invalid epsilon value: ", o.eps());
  TORCH_CHECK(o.weight_decay() >= 0, "Invalid weight_decay value: ", o.weight_decay());
  TORCH_CHECK(o.partition() == "row" || o.partition() == "head" || o.partition() == "element",
              "Invalid partition: '", o.partition(), "' (valid: row, head, element)");
  TORCH_CHECK(o.partition() != "head" || o.head_size() >= 1,
              "Invalid head_size value: ", o.head_size(), " (partition head needs >= 1)");
}

std::vector<std::string> lower_components(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t dot = lower.find('.', start);
    parts.push_back(lower.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

}  // namespace

void AdamMiniOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(partition);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(head_size);
}

void AdamMiniOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(std::string, partition);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, head_size);
}

void AdamMiniParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
}

void AdamMiniParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg_sq);
}

int64_t AdamMini::blocks_for(const AdamMiniOptions& options, torch::IntArrayRef sizes) {
  int64_t numel = 1;
  for (const int64_t s : sizes) numel *= s;
  if (options.partition() == "element") return numel;
  if (options.partition() == "head") return sizes[0] / options.head_size();
  size_t first = 0;  // leading dimensions of size 1 do not count: (1, T, C) goes by T
  while (first < sizes.size() && sizes[first] == 1) ++first;
  return sizes.size() - first >= 2 ? sizes[first] : 1;
}

AdamMini::AdamMini(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                   AdamMiniOptions defaults)
    : SerializingOptimizer(std::move(param_groups), std::make_unique<AdamMiniOptions>(defaults)) {
  check_adam_mini_hyperparameters(defaults);
  for (const auto& group : param_groups_) {
    const auto& options = static_cast<const AdamMiniOptions&>(group.options());
    check_adam_mini_hyperparameters(options);
    if (options.partition() != "head") continue;
    for (const auto& p : group.params()) {
      TORCH_CHECK(p.dim() == 2 && p.size(0) % options.head_size() == 0,
                  "Invalid head_size value: ", options.head_size(),
                  " does not divide the rows of a ", p.sizes(), " parameter into heads");
    }
  }
}

torch::Tensor AdamMini::step(LossClosure closure) {
  auto update_one = [](const AdamMiniOptions& options, torch::Tensor& p, auto& slot) {
    if (p.numel() == 0) return;
    const auto [beta1, beta2] = options.betas();
    const double lr = options.lr();
    if (!slot) {
      auto state = std::make_unique<AdamMiniParamState>();
      state->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Contiguous));
      state->exp_avg_sq(torch::zeros({blocks_for(options, p.sizes())}, p.options()));
      slot = std::move(state);
    }
    auto& state = static_cast<AdamMiniParamState&>(*slot);
    auto& exp_avg = state.exp_avg();
    auto& exp_avg_sq = state.exp_avg_sq();
    // The blocks come from v, so a loaded state keeps the partition it was saved with.
    const int64_t blocks = exp_avg_sq.numel();
    const auto grad = p.grad().reshape({blocks, -1});  // (B, numel / B)
    exp_avg_sq.mul_(beta2).add_(grad.square().mean(1), 1 - beta2);
    state.step(state.step() + 1);
    if (options.weight_decay() != 0) p.mul_(1 - lr * options.weight_decay());
    exp_avg.lerp_(p.grad(), 1 - beta1);  // the reference's lerp: m + (1 - beta1) (g - m)
    const double bias_correction1 = 1 - std::pow(beta1, state.step());
    const double bias_correction2 = 1 - std::pow(beta2, state.step());
    const auto denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(options.eps());
    const auto step_size = denom.reciprocal().mul_(lr / bias_correction1).unsqueeze(1);  // (B, 1)
    p.sub_((exp_avg.view({blocks, -1}) * step_size).view(p.sizes()));
  };
  return step_each_parameter<AdamMiniOptions>(*this, "Adam-mini", closure, update_one);
}

AdamMiniRole adam_mini_role(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  auto has = [&](const char* part) { return lower.find(part) != std::string::npos; };
  AdamMiniRole role;
  role.weight_decay = !(has("norm") || has("ln") || has("bias"));
  if (has("bias")) {
    role.partition = "element";
    return role;
  }
  // A query or key projection's own weight ("...q_proj.weight"), not an adapter inside it.
  const auto parts = lower_components(name);
  const bool query_or_key =
      parts.size() >= 2 && parts.back() == "weight" &&
      std::set<std::string>{"q_proj", "k_proj", "wq", "wk", "query", "key"}.count(
          parts[parts.size() - 2]) > 0;
  role.partition = query_or_key ? "head" : "row";
  return role;
}

namespace {

// A function-local static: the registry may be built during another file's static
// initialization.
const std::vector<std::string>& adam_mini_keys() {
  static const std::vector<std::string> keys = {"betas", "eps"};
  return keys;
}

std::unique_ptr<torch::optim::Optimizer> make_adam_mini(std::vector<torch::Tensor> params,
                                                        const ParamInfo& info, double lr,
                                                        double weight_decay,
                                                        const OptSettings& opt) {
  OptReader r("adam-mini", opt, adam_mini_keys());
  const auto betas = r.pair("betas", {0.9, 0.999});
  const double eps = r.number("eps", 1e-8);
  check_betas("adam-mini", betas);
  check_range(eps >= 0, fmt::format("adam-mini eps={} must be >= 0", eps));
  const auto& names = info.names;
  if (names.empty() && !params.empty())
    fail_runtime(
        "adam-mini needs the parameters' names to cut them into blocks (attention heads, "
        "output rows, biases)",
        "build it with make_optimizer(name, params, ParamInfo{names, head_sizes}, ...) "
        "(torch::nn::Module::named_parameters())");
  const auto defaults = AdamMiniOptions(lr)
                            .betas(std::make_tuple(betas.first, betas.second))
                            .eps(eps)
                            .weight_decay(weight_decay);

  // One group per (partition, head size, weight decay), in the order they first appear.
  std::vector<std::pair<std::tuple<std::string, int64_t, bool>, std::vector<torch::Tensor>>>
      groups_by_kind;
  for (size_t i = 0; i < params.size(); ++i) {
    const AdamMiniRole role = adam_mini_role(names[i]);
    const int64_t head_size =
        role.partition == "head" && i < info.head_sizes.size() ? info.head_sizes[i] : 0;
    if (role.partition == "head" && head_size <= 0)
      fail_runtime(
          "adam-mini needs the attention head size of '" + names[i] + "' to cut it into heads",
          "build it with make_optimizer(name, params, ParamInfo{names, head_sizes}, "
          "...) (attention_head_sizes in models/common/layers.h)");
    if (role.partition == "head" && (params[i].dim() != 2 || params[i].size(0) % head_size != 0)) {
      std::ostringstream shape;
      shape << params[i].sizes();
      fail_runtime(fmt::format("adam-mini: head size {} does not divide the rows of '{}' {} into "
                               "heads",
                               head_size, names[i], shape.str()),
                   "ParamInfo::head_sizes[i] is the rows per head of a query or key weight");
    }
    const auto kind = std::make_tuple(role.partition, head_size, role.weight_decay);
    auto it = std::find_if(groups_by_kind.begin(), groups_by_kind.end(),
                           [&](const auto& g) { return g.first == kind; });
    if (it == groups_by_kind.end()) {
      groups_by_kind.push_back({kind, {}});
      it = std::prev(groups_by_kind.end());
    }
    it->second.push_back(params[i]);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (auto& [kind, group_params] : groups_by_kind) {
    const auto& [partition, head_size, decayed] = kind;
    auto options = AdamMiniOptions(defaults).partition(partition).head_size(head_size).weight_decay(
        decayed ? weight_decay : 0.0);
    groups.emplace_back(std::move(group_params), std::make_unique<AdamMiniOptions>(options));
  }
  if (groups.empty()) groups.emplace_back(std::vector<torch::Tensor>{});
  return construct_optimizer<AdamMini>("adam-mini", std::move(groups), defaults);
}

// m per element; v one float per block: per row (per head for q and k, fewer), per element
// of a bias, one for a norm's vector. Rows bound the blocks from above.
OptimizerMemory adam_mini_memory(const MemoryRuleInput& in) {
  int64_t blocks = 0;
  for (const ParamExtent& p : in.params()) blocks += p.rows;
  return {in.total() + blocks * kOptimizerFloatBytes, 2 * in.largest()};
}

}  // namespace

OptimizerEntry adam_mini_entry() {
  OptimizerEntry e;
  e.make = make_adam_mini;
  e.default_lr = 1e-3;
  e.keys = adam_mini_keys();
  e.lr_by_model = toy_learning_rates(1e-1);
  e.memory = adam_mini_memory;
  return e;
}

}  // namespace gradscope
