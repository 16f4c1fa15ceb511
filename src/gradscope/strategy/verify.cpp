#include "gradscope/strategy/verify.h"

#include <algorithm>
#include <cmath>

#include "gradscope/core/error.h"
#include "gradscope/core/rng.h"
#include "gradscope/models/registry.h"
#include "gradscope/optim/factory.h"
#include "gradscope/strategy/builtin.h"
#include "gradscope/strategy/strategy.h"
#include "gradscope/train/data_source.h"

namespace gradscope {
namespace {

constexpr double kAccumulationTolerance = 1e-5;
constexpr double kDropoutForCheckpointCheck = 0.1;
constexpr double kFusedTolerance = 1e-6;

class NullObserver : public PhaseObserver {
 public:
  void enter(Phase) override {}
};

struct StepResult {
  double loss = 0;
  // The gradients, or the parameters after the optimizer step when one was taken.
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
};

// One gradient computation of `strategy` from freshly built (identical) weights. With
// `optimizer_step`, also one step of config.optimizer (fused into the backward when the
// strategy steps the optimizer itself); the result then holds the updated parameters.
StepResult one_step(const RunConfig& base, const nlohmann::json& arch, const DataSource& data,
                    const std::string& strategy, int64_t micro_batches, int64_t micro_batch,
                    const torch::Device& device, bool optimizer_step = false) {
  RunConfig c = base;
  c.strategy = strategy;
  c.accum_steps = micro_batches;
  c.batch = micro_batch;
  const ModelFamily& family = model_registry().get(c.model);
  std::shared_ptr<Model> model = family.build(arch, c.seed);
  model->to(device);
  model->train();
  std::unique_ptr<Strategy> s = strategy_registry().get(strategy).make(c);
  s->attach(*model);
  const double lr = c.lr > 0 ? c.lr : default_lr(c.optimizer, c.model);
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (optimizer_step) {
    if (s->steps_optimizer())
      s->attach_optimizer(model->parameters(), c, lr);
    else
      optimizer = make_optimizer(c.optimizer, model->parameters(), lr, c.weight_decay, c.opt);
  }
  // The same dropout stream for the reference and the candidate.
  torch::manual_seed(hash3(c.seed, 0xd50, 0));
  NullObserver observer;
  MicroBatchSource next = [&](int64_t i) {
    return data.train_batch(i * micro_batch, micro_batch).to(device);
  };
  StepOutput out = s->compute_gradients(*model, micro_batches, next, observer);
  StepResult r;
  r.loss =
      out.loss_sum.item<double>() / static_cast<double>(std::max<int64_t>(out.target_count, 1));
  if (optimizer_step) {
    if (optimizer) optimizer->step();
    for (const auto& p : model->named_parameters())
      r.tensors.emplace_back(p.key(), p.value().detach().to(torch::kCPU).to(torch::kFloat64));
    return r;
  }
  for (const auto& p : model->named_parameters()) {
    check_usage(p.value().grad().defined(),
                "strategy '" + strategy + "' left no gradient in parameter '" + p.key() + "'",
                "every parameter must receive a gradient");
    r.tensors.emplace_back(p.key(), p.value().grad().detach().to(torch::kCPU).to(torch::kFloat64));
  }
  return r;
}

VerifyCheck compare(const std::string& strategy, const StepResult& got, const StepResult& ref,
                    bool bitwise, double tolerance, bool parameters = false) {
  VerifyCheck check;
  check.strategy = strategy;
  check.criterion = bitwise ? "bitwise" : fmt::format("relative <= {:g}", tolerance);
  if (parameters) check.criterion = "params " + check.criterion;
  check.loss_abs_diff = std::fabs(got.loss - ref.loss);
  check.loss_rel_diff = check.loss_abs_diff / std::max(std::fabs(ref.loss), 1e-30);
  check.tensors = static_cast<int64_t>(ref.tensors.size());
  // Some gradients are zero in exact arithmetic and rounding noise in floating point (the key
  // projection's bias: softmax ignores a shift shared by all of a query's scores). Relative to
  // their own norm, two noises differ by 100%; so a tensor whose reference norm is below
  // kZeroFraction of the whole gradient's is measured against the whole gradient's norm.
  constexpr double kZeroFraction = 1e-6;
  double whole_sq = 0;
  for (const auto& t : ref.tensors) whole_sq += t.second.pow(2).sum().item<double>();
  const double whole = std::sqrt(whole_sq);
  for (size_t i = 0; i < ref.tensors.size(); ++i) {
    const torch::Tensor diff = got.tensors[i].second - ref.tensors[i].second;
    const double max_abs = diff.abs().max().item<double>();
    double ref_norm = ref.tensors[i].second.norm().item<double>();
    if (ref_norm < kZeroFraction * whole) ref_norm = whole;
    const double rel =
        ref_norm > 0 ? diff.norm().item<double>() / ref_norm : (max_abs > 0 ? INFINITY : 0.0);
    check.grad_max_abs_diff = std::max(check.grad_max_abs_diff, max_abs);
    if (rel >= check.grad_max_rel_diff) {
      check.grad_max_rel_diff = rel;
      check.worst_tensor = ref.tensors[i].first;
    }
  }
  check.passed = bitwise
                     ? (check.grad_max_abs_diff == 0 && check.loss_abs_diff == 0)
                     : (check.grad_max_rel_diff <= tolerance && check.loss_rel_diff <= tolerance);
  return check;
}

// Whether the model's blocks run their attention and MLP branches as sub-layers.
bool model_exposes_sublayers(const RunConfig& config, const nlohmann::json& arch) {
  auto model = model_registry().get(config.model).build(arch, config.seed);
  for (const auto& block : model->blocks())
    if (!block->exposes_sublayers()) return false;
  return !model->blocks().empty();
}

}  // namespace

std::vector<VerifyCheck> verify_strategies(const RunConfig& config,
                                           const std::vector<std::string>& strategies) {
  std::vector<std::string> names = strategies;
  if (names.empty())
    for (const auto& n : strategy_registry().names())
      if (n != "standard") names.push_back(n);
  for (const auto& n : names) strategy_registry().get(n);  // unknown names fail before work

  const torch::Device device(config.device);
  const int64_t micro = config.batch;
  const int64_t k = std::max<int64_t>(config.accum_steps, 2);
  const ModelFamily& family = model_registry().get(config.model);

  // Dropout forced on for the checkpoint checks, off for the accumulation checks.
  // (A toy problem has no dropout: both stay unset there.)
  RunConfig with_dropout = config;
  RunConfig without_dropout = config;
  if (family.kind != "toy") {
    with_dropout.dropout = kDropoutForCheckpointCheck;
    without_dropout.dropout = 0.0;
  }
  const nlohmann::json arch_dropout = resolve_arch(with_dropout);
  const nlohmann::json arch_plain = resolve_arch(without_dropout);
  auto data = make_data_source(family.kind, arch_plain, config);

  std::vector<VerifyCheck> checks;
  std::optional<StepResult> ref_dropout, ref_plain, ref_step;
  // The fused step runs the run's optimizer when it supports it, SGD otherwise.
  const auto& fused = fused_optimizers();
  RunConfig stepped = with_dropout;
  if (std::find(fused.begin(), fused.end(), stepped.optimizer) == fused.end())
    stepped.optimizer = "sgd";
  stepped.clip_grad_norm = 0;
  for (const auto& name : names) {
    const StrategyEntry& entry = strategy_registry().get(name);
    const bool accumulates = entry.uses_micro_batches;
    if (entry.steps_optimizer) {
      // Parameters after one step against standard + the unfused optimizer. SGD's update is
      // the same arithmetic in either order, bitwise; the others within 1e-6 per tensor.
      if (!ref_step)
        ref_step = one_step(stepped, arch_dropout, *data, "standard", 1, micro * k, device, true);
      const StepResult got =
          one_step(stepped, arch_dropout, *data, name, 1, micro * k, device, true);
      const bool bitwise = device.is_cpu() && stepped.optimizer == "sgd";
      checks.push_back(compare(name, got, *ref_step, bitwise, kFusedTolerance, true));
    } else if (!accumulates) {
      if (!ref_dropout)
        ref_dropout = one_step(with_dropout, arch_dropout, *data, "standard", 1, micro * k, device);
      // Checkpointing is checked under each policy (whole blocks, then each residual branch
      // alone) unless the configuration names one.
      std::vector<std::string> policies = {with_dropout.checkpoint_policy};
      if (name == "checkpoint" && with_dropout.checkpoint_policy == "full" &&
          model_exposes_sublayers(with_dropout, arch_dropout))
        policies = {"full", "attention", "mlp"};
      for (const auto& policy : policies) {
        RunConfig c = with_dropout;
        c.checkpoint_policy = policy;
        const StepResult got = one_step(c, arch_dropout, *data, name, 1, micro * k, device);
        // Bitwise on the CPU; CUDA kernels may pick other reduction orders on a recompute.
        const bool bitwise = device.is_cpu();
        const std::string label = policy == "full" ? name : name + " (" + policy + ")";
        checks.push_back(compare(label, got, *ref_dropout, bitwise, 1e-6));
      }
    } else {
      if (!ref_plain)
        ref_plain = one_step(without_dropout, arch_plain, *data, "standard", 1, micro * k, device);
      const StepResult got = one_step(without_dropout, arch_plain, *data, name, k, micro, device);
      checks.push_back(compare(name, got, *ref_plain, false, kAccumulationTolerance));
    }
  }
  return checks;
}

}  // namespace gradscope
