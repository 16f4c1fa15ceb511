// `gradscope verify --nproc N`: every --shard mode (fsdp with either --grad-reduce) against one
// process of the global batch (verify.h).
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/models/registry.h"
#include "gradscope/strategy/shard.h"
#include "gradscope/train/autocast.h"
#include "gradscope/train/session.h"
#include "gradscope/train/verify.h"
#include "gradscope/train/verify_parts.h"

namespace gradscope {
namespace {

using verify_parts::kAccumulationTolerance;
using verify_parts::kAccumulationToleranceBf16;
using verify_parts::kReferenceOptimizer;
using verify_parts::nonzero_adapters;
using verify_parts::NullObserver;

// Several ranks (--nproc, every --shard mode) against one process of the global batch, dropout
// off, over kShardSteps optimizer steps. The ranks compute the same sums over the batch in
// another order: each rank sums its own samples, then the all-reduce adds the ranks' partial
// sums (zero and fsdp slice the update, which is elementwise, so the slicing itself changes
// nothing). That is accumulation's reordering, with the ranks as micro-batches: its tolerance,
// 1e-5 norm-wise in fp32 and 2e-2 in bf16, on what the steps moved each parameter by under SGD
// with momentum (its update and its sharded state are linear in the gradients, so they keep
// the gradients' relative difference), and on the losses of every step. The run's optimizer,
// when it is another, is compared on the losses: Adam divides by sqrt(v), which magnifies the
// rounding of gradients near zero (1.3e-5 norm-wise on a norm weight after two steps of the
// tiny Llama) past a tolerance on the parameters that would still catch a wrong sample.
// A rank that read the wrong samples, a bucket reduced twice or a shard written to the wrong
// place is off by 1/N or more.
constexpr int kShardSteps = 2;
constexpr double kShardTolerance = kAccumulationTolerance;
constexpr double kShardToleranceBf16 = kAccumulationToleranceBf16;
constexpr double kShardMomentum = 0.9;

// kShardSteps steps of `config` (with options.comm: this rank's share of several), the losses
// of every step and what the steps moved each parameter by, in float64 on the CPU.
struct ShardRun {
  std::vector<double> losses;
  std::vector<std::pair<std::string, torch::Tensor>> before, after;
};
ShardRun shard_steps(const RunConfig& config, const SessionOptions& options) {
  Session session(config, options);
  nonzero_adapters(session);
  seed_dropout(session.config(), session.rank());
  NullObserver observer;
  const bool bf16 = config.dtype == Dtype::kBf16;
  Updater& updater = *session.updater();
  const auto snapshot = [&] {
    updater.gather_parameters();  // fsdp: the whole parameters
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& p : session.model().named_parameters())
      out.emplace_back(p.key(), p.value().detach().to(torch::kCPU).to(torch::kFloat64));
    updater.scatter_parameters();
    return out;
  };
  ShardRun r;
  r.before = snapshot();
  for (int step = 0; step < kShardSteps; ++step) {
    const MicroBatchSource next = session.step_batches(step);
    const auto gradients = [&] {
      AutocastScope autocast(session.device(), bf16);
      return session.strategy().compute_gradients(session.model(), next, observer);
    };
    const StepOutput out = updater.step(gradients, observer).out;
    r.losses.push_back(out.loss_sum.item<double>() /
                       static_cast<double>(std::max<int64_t>(out.target_count, 1)));
  }
  r.after = snapshot();
  return r;
}

// The parameters after the steps against the reference's: per tensor, the difference within
// `tolerance` of what the reference's steps moved it by, plus the float32 rounding of the
// parameters themselves (each step writes them rounded to 2^-24 relative, in both runs): an
// update of 1e-5 to a weight of 1 is only resolved to 6e-8.
void compare_parameters(const ShardRun& got, const ShardRun& ref, double tolerance,
                        VerifyCheck& check) {
  const double rounding = 2.0 * kShardSteps * std::ldexp(1.0, -24);
  check.passed = true;
  check.tensors = static_cast<int64_t>(ref.after.size());
  for (size_t i = 0; i < ref.after.size(); ++i) {
    const torch::Tensor diff = got.after[i].second - ref.after[i].second;
    const double moved = (ref.after[i].second - ref.before[i].second).norm().item<double>();
    const double bound = tolerance * moved + rounding * ref.after[i].second.norm().item<double>();
    const double d = diff.norm().item<double>();
    check.grad_max_abs_diff = std::max(check.grad_max_abs_diff, diff.abs().max().item<double>());
    const double rel = bound > 0 ? d / bound * tolerance : (d > 0 ? INFINITY : 0.0);
    if (rel >= check.grad_max_rel_diff) {
      check.grad_max_rel_diff = rel;
      check.worst_tensor = ref.after[i].first;
    }
    if (d > bound) check.passed = false;
  }
}
}  // namespace

std::vector<VerifyCheck> verify_sharding(const RunConfig& config,
                                         const std::shared_ptr<Communicator>& comm,
                                         const VerifyOptions& options) {
  check_usage(comm != nullptr, "verify of --shard needs the ranks' communicator");
  const int64_t world = comm->world();
  RunConfig base = config;
  base.strategy.reset();
  base.optimizer_step.reset();
  const ModelFamily& family = model_registry().get(config.model);
  if (family.kind != ModelKind::kToy) base.dropout = 0.0;
  base.lora_dropout = 0.0;
  base.save_state.clear();
  base.resume.clear();
  base.save_weights.clear();
  const std::shared_ptr<const DataSource> data = make_data_source(family, resolve_arch(base), base);
  const std::vector<Dtype> dtypes = options.dtypes.empty()
                                        ? std::vector<Dtype>{Dtype::kFp32, Dtype::kBf16}
                                        : options.dtypes;
  std::vector<VerifyCheck> checks;
  for (const Dtype dtype : dtypes) {
    RunConfig one = base;
    one.dtype = dtype;
    one.set_ranks_on_one_host(1);
    one.shard = Shard::kNone;
    one.batch = config.batch * world;
    SessionOptions alone;
    alone.data = data;
    const double tolerance = dtype == Dtype::kBf16 ? kShardToleranceBf16 : kShardTolerance;
    // The reference optimizer (SGD) with momentum on the parameters and losses; the run's
    // optimizer, when it is another, on the losses.
    std::vector<std::pair<RunConfig, bool>> optimizers;
    RunConfig sgd = one;
    sgd.optimizer = kReferenceOptimizer;
    sgd.lr = 0;
    sgd.opt = {{"momentum", fmt::format("{}", kShardMomentum)}};
    optimizers.emplace_back(sgd, true);
    if (config.optimizer != sgd.optimizer) optimizers.emplace_back(one, false);
    for (const auto& [reference, parameters] : optimizers) {
      // Every rank computes the reference itself (no collective), from the same seed.
      const ShardRun ref = shard_steps(reference, alone);
      // fsdp twice: its blocks' gradients all-reduced, and reduce-scattered.
      const std::pair<Shard, GradReduce> modes[] = {
          {Shard::kDdp, GradReduce::kAllReduce},  {Shard::kZero1, GradReduce::kAllReduce},
          {Shard::kZero2, GradReduce::kAllReduce}, {Shard::kFsdp, GradReduce::kAllReduce},
          {Shard::kFsdp, GradReduce::kReduceScatter}};
      for (const auto& [shard, reduce] : modes) {
        if (!shard_refusal(shard, reference.optimizer).empty()) continue;
        RunConfig c = reference;
        c.nproc = world;
        c.shard = shard;
        c.grad_reduce = reduce;
        c.batch = config.batch;
        SessionOptions shared;
        shared.data = data;
        shared.comm = comm;
        const ShardRun got = shard_steps(c, shared);
        const std::string label = fmt::format(
            "{}{} x{}, {}, {} steps", shard_name(shard),
            reduce == GradReduce::kReduceScatter ? " reduce-scatter" : "", world,
            reference.optimizer, kShardSteps);
        VerifyCheck check;
        check.strategy = label;
        check.dtype = dtype;
        check.passed = true;
        check.tensors = static_cast<int64_t>(ref.after.size());
        if (parameters) {
          check.criterion = fmt::format("params relative <= {:g}", tolerance);
          compare_parameters(got, ref, tolerance, check);
        } else {
          check.criterion = fmt::format("losses relative <= {:g}", tolerance);
        }
        for (size_t i = 0; i < ref.losses.size() && i < got.losses.size(); ++i) {
          const double d = std::fabs(got.losses[i] - ref.losses[i]);
          check.loss_abs_diff = std::max(check.loss_abs_diff, d);
          check.loss_rel_diff =
              std::max(check.loss_rel_diff, d / std::max(std::fabs(ref.losses[i]), 1e-30));
        }
        check.passed = check.passed && check.loss_rel_diff <= tolerance;
        checks.push_back(check);
      }
    }
  }
  return checks;
}
}  // namespace gradscope
