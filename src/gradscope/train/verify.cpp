#include "gradscope/train/verify.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/models/registry.h"
#include "gradscope/strategy/fused.h"
#include "gradscope/strategy/shard.h"
#include "gradscope/train/autocast.h"
#include "gradscope/train/session.h"

namespace gradscope {
namespace {

constexpr double kAccumulationTolerance = 1e-5;
// bfloat16 keeps 8 significant bits (2^-8 = 3.9e-3 relative spacing). Each micro-batch's
// products are rounded to it apart, so accumulation sums k rounded parts where standard
// training rounds one sum: differences of about one spacing per element, well under 2e-2
// norm-wise; an accumulation that dropped or doubled a micro-batch is off by 1/k or more.
constexpr double kAccumulationToleranceBf16 = 2e-2;
constexpr double kDropoutForCheckpointCheck = 0.1;
constexpr double kFusedTolerance = 1e-6;
// Accumulation folded into SGD's momentum in backward (accumulation+fused): one step, with
// and without weight decay. (A second step would be taken from parameters that already differ
// by the first step's rounding, which moves a small gradient such as a key projection's by
// more than its own rounding: 8e-6 relative measured on the tiny Llama. The unit tests check
// the buffer's decay over two steps.)
constexpr int kFoldSteps = 1;
constexpr double kFoldMomentum = 0.9;
constexpr double kFoldWeightDecay = 0.1;
// A recompute on CUDA may sum in another order than its forward did: float32 agrees to its
// rounding; under bfloat16 an activation may round to the neighbouring value, a few units of
// its 2^-8 spacing in the gradients.
constexpr double kRecomputeToleranceCuda = 1e-6;
constexpr double kRecomputeToleranceCudaBf16 = 1e-2;
// Under bfloat16 on the CPU the recompute's values are the forward's, bitwise, but autocast's
// casts add nodes to the graph, and a tensor that feeds several of them (ModernBERT's tied
// embedding, through the first block's attention) may sum its float32 gradient parts in
// another order inside the recomputed graph: 2.9e-6 measured there, 0 on the other models.
constexpr double kRecomputeToleranceCpuBf16 = 1e-5;
// The chunked loss (--loss chunked, docs/strategies.md "The chunked loss") computes each
// position's values as the full loss does; it sums over positions in another order: the loss
// and the head's weight and bias gradients as one sum per chunk, then over chunks. A reordered
// float32 sum of n terms differs by about sqrt(n) units of 2^-24 relative (1e-6 for 10^4
// positions), and each row's logsumexp by a few units; 1e-5 holds that with room for
// cancellation, while a chunk dropped, doubled or given the wrong rows is off by 1/K (K chunks)
// or more. Under bfloat16 each chunk's weight-gradient product is rounded to bfloat16 apart
// before the float32 sum, as accumulation's micro-batches are: the bf16 accumulation tolerance.
// On top of a strategy the tolerances add (both reorder the same sums).
constexpr double kChunkedLossTolerance = 1e-5;
constexpr double kChunkedLossToleranceBf16 = kAccumulationToleranceBf16;
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

// --attention sdpa against --attention math (dropout off): the same softmax(QK^T / sqrt(d) +
// mask) V, with SDPA's fused kernel summing in another order (blocks of keys, a running
// maximum and a rescaled running sum). In fp32 that is a reordered float32 sum per output
// element, a few units of 2^-24 relative, carried into gradients that sum over positions and
// samples: accumulation's 1e-5 norm-wise holds it, while a lost mask, a wrong scale or a
// wrong head mapping is off by O(1). Under bf16 autocast the math path rounds the scores and
// the attention weights to bfloat16 (2^-8 relative each) where the fused kernel keeps them in
// float32 and rounds only its output: differences of a few bfloat16 spacings, accumulation's
// bf16 tolerance. On top of a strategy the tolerances add.
constexpr double kAttentionTolerance = kAccumulationTolerance;
constexpr double kAttentionToleranceBf16 = kAccumulationToleranceBf16;

// Positions per chunk when the configuration names none: a prime, so that the chunks divide no
// batch of the presets and the last chunk of each forward is a partial one.
constexpr int64_t kVerifyLossChunk = 37;

class NullObserver : public PhaseObserver {
 public:
  void enter(Phase) override {}
};

// LoRA's B starts at zero, which leaves A without a gradient in the first step: every check
// draws B from the seed instead, the same in every session, so that both matrices are checked.
void nonzero_adapters(Session& session) {
  if (!session.config().lora()) return;
  auto gen = at::detail::createCPUGenerator(session.config().seed + 1);
  draw_lora_b(session.model(), 0.02, gen);
}

struct StepResult {
  double loss = 0;
  // The gradients, or the parameters after the optimizer step when one was taken.
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  std::vector<std::string> missing;  // parameters left without a gradient
};

// One step of `config` (its strategy, micro-batch, micro-batches and dtype) from freshly built
// (identical) weights over `data`: the gradients, or with `optimizer_step` the parameters
// after one step of config.optimizer (fused into the backward when the strategy steps the
// optimizer itself). A parameter without a gradient counts as a zero gradient and is named.
StepResult one_step(const RunConfig& config, const std::shared_ptr<const DataSource>& data,
                    bool optimizer_step, const VerifyOptions& verify) {
  SessionOptions options;
  options.data = data;
  options.updater = optimizer_step;
  Session session(config, options);
  nonzero_adapters(session);
  if (verify.instrument) verify.instrument(session.model(), session.strategy().plan());
  // The same dropout stream for the reference and the candidate.
  seed_dropout(session.config());
  NullObserver observer;
  const MicroBatchSource next = session.step_batches(0);
  const bool bf16 = config.dtype == Dtype::kBf16;
  // As the trainer runs a step: the strategy under autocast, the optimizer outside it.
  const auto gradients = [&] {
    AutocastScope autocast(session.device(), bf16);
    return session.strategy().compute_gradients(session.model(), next, observer);
  };
  const StepOutput out =
      optimizer_step ? session.updater()->step(gradients, observer).out : gradients();
  StepResult r;
  r.loss =
      out.loss_sum.item<double>() / static_cast<double>(std::max<int64_t>(out.target_count, 1));
  for (const auto& p : session.model().named_parameters()) {
    if (optimizer_step) {
      r.tensors.emplace_back(p.key(), p.value().detach().to(torch::kCPU).to(torch::kFloat64));
      continue;
    }
    if (!p.value().requires_grad()) continue;  // frozen (LoRA's base): no gradient to check
    const torch::Tensor grad = p.value().grad();
    if (!grad.defined()) r.missing.push_back(p.key());
    r.tensors.emplace_back(p.key(), grad.defined()
                                        ? grad.detach().to(torch::kCPU).to(torch::kFloat64)
                                        : torch::zeros(p.value().sizes(), torch::kFloat64));
  }
  return r;
}

// The parameters after `steps` steps of `config` (its updater), or with `updates` what the
// steps moved them by (p_after - p_before), in float64 on the CPU; the loss is the first
// step's.
StepResult parameter_updates(const RunConfig& config, const std::shared_ptr<const DataSource>& data,
                             int steps, bool updates) {
  SessionOptions options;
  options.data = data;
  Session session(config, options);
  nonzero_adapters(session);
  seed_dropout(session.config());
  NullObserver observer;
  const bool bf16 = config.dtype == Dtype::kBf16;
  std::vector<torch::Tensor> before;
  for (const auto& p : session.model().named_parameters())
    before.push_back(p.value().detach().to(torch::kCPU).to(torch::kFloat64));
  StepResult r;
  for (int step = 0; step < steps; ++step) {
    const MicroBatchSource next = session.step_batches(step);
    const auto gradients = [&] {
      AutocastScope autocast(session.device(), bf16);
      return session.strategy().compute_gradients(session.model(), next, observer);
    };
    const StepOutput out = session.updater()->step(gradients, observer).out;
    if (step == 0)
      r.loss =
          out.loss_sum.item<double>() / static_cast<double>(std::max<int64_t>(out.target_count, 1));
  }
  size_t i = 0;
  for (const auto& p : session.model().named_parameters())
    r.tensors.emplace_back(p.key(), p.value().detach().to(torch::kCPU).to(torch::kFloat64) -
                                        (updates ? before[i++] : torch::zeros_like(before[i++])));
  return r;
}

// `base` with the strategy `shorthand`, split into `micro_batches` of `micro_batch`.
RunConfig with_strategy(const RunConfig& base, const StrategyShorthand& shorthand,
                        int64_t micro_batches, int64_t micro_batch) {
  RunConfig c = base;
  // What a checkpoint recomputes, however it was asked for, goes with the shorthand.
  if (base.recompute && *base.recompute != Recompute::kNone)
    c.checkpoint_policy = base.recompute;
  c.strategy = shorthand;
  c.recompute.reset();
  c.optimizer_step.reset();
  c.accum_steps = micro_batches;
  c.batch = micro_batch;
  return c;
}

VerifyCheck compare(const std::string& strategy, Dtype dtype, const StepResult& got,
                    const StepResult& ref, bool bitwise, double tolerance,
                    bool parameters = false) {
  VerifyCheck check;
  check.strategy = strategy;
  check.dtype = dtype;
  check.criterion = bitwise ? "bitwise" : fmt::format("relative <= {:g}", tolerance);
  if (parameters) check.criterion = "params " + check.criterion;
  check.loss_abs_diff = std::fabs(got.loss - ref.loss);
  check.loss_rel_diff = check.loss_abs_diff / std::max(std::fabs(ref.loss), 1e-30);
  check.tensors = static_cast<int64_t>(ref.tensors.size());
  // Some gradients are zero in exact arithmetic and rounding noise in floating point (the key
  // projection's bias: softmax ignores a shift shared by all of a query's scores). Relative to
  // their own norm, two noises differ by 100%; so a tensor whose reference norm is below
  // 1e-6 of the whole gradient's is measured against the whole gradient's norm.
  // Under bf16 that noise is at bfloat16's rounding (2^-8 of the terms summed), so there the
  // fraction is the bf16 accumulation tolerance.
  const double zero_fraction = dtype == Dtype::kBf16 ? kAccumulationToleranceBf16 : 1e-6;
  double whole_sq = 0;
  for (const auto& t : ref.tensors) whole_sq += t.second.pow(2).sum().item<double>();
  const double whole = std::sqrt(whole_sq);
  for (size_t i = 0; i < ref.tensors.size(); ++i) {
    const torch::Tensor diff = got.tensors[i].second - ref.tensors[i].second;
    const double max_abs = diff.abs().max().item<double>();
    double ref_norm = ref.tensors[i].second.norm().item<double>();
    if (ref_norm < zero_fraction * whole) ref_norm = whole;
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
  // Every parameter must get a gradient, in the candidate and in the reference alike.
  check.missing_grads = static_cast<int64_t>(got.missing.size() + ref.missing.size());
  if (check.missing_grads > 0) {
    check.passed = false;
    check.worst_tensor =
        "no gradient: " +
        (got.missing.empty() ? ref.missing.front() + " (reference)" : got.missing.front());
  }
  return check;
}

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
    one.nproc = 1;
    one.shard = Shard::kNone;
    one.batch = config.batch * world;
    SessionOptions alone;
    alone.data = data;
    const double tolerance = dtype == Dtype::kBf16 ? kShardToleranceBf16 : kShardTolerance;
    // SGD with momentum on the parameters and losses; the run's optimizer on the losses.
    std::vector<std::pair<RunConfig, bool>> optimizers;
    RunConfig sgd = one;
    sgd.optimizer = "sgd";
    sgd.lr = 0;
    sgd.opt = {{"momentum", fmt::format("{}", kShardMomentum)}};
    optimizers.emplace_back(sgd, true);
    if (config.optimizer != "sgd") optimizers.emplace_back(one, false);
    for (const auto& [reference, parameters] : optimizers) {
      // Every rank computes the reference itself (no collective), from the same seed.
      const ShardRun ref = shard_steps(reference, alone);
      for (const Shard shard :
           {Shard::kDdp, Shard::kZero1, Shard::kZero2, Shard::kFsdp}) {
        if (!shard_refusal(shard, reference.optimizer).empty()) continue;
        RunConfig c = reference;
        c.nproc = world;
        c.shard = shard;
        c.batch = config.batch;
        SessionOptions shared;
        shared.data = data;
        shared.comm = comm;
        const ShardRun got = shard_steps(c, shared);
        const std::string label = fmt::format("{} x{}, {}, {} steps", shard_name(shard), world,
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

std::vector<VerifyCheck> verify_strategies(const RunConfig& config,
                                           const std::vector<std::string>& strategies) {
  VerifyOptions options;
  options.strategies = strategies;
  return verify_strategies(config, options);
}

std::vector<VerifyCheck> verify_strategies(const RunConfig& config, const VerifyOptions& options) {
  std::vector<std::string> names = options.strategies;
  if (names.empty())
    for (const auto& s : strategy_shorthands())
      if (s.name != "standard") names.push_back(s.name);
  std::vector<StrategyShorthand> shorthands;
  for (const auto& n : names) {  // unknown names fail before any work
    const auto s = parse_strategy(n);
    if (!s) {
      std::string valid;
      for (const auto& d : strategy_shorthands()) valid += (valid.empty() ? "" : ", ") + d.name;
      fail_usage("unknown strategy '" + n + "'", "valid strategies: " + valid);
    }
    shorthands.push_back(*s);
  }

  check_usage(!config.recompute || *config.recompute != Recompute::kNone,
              "verify checks what checkpointing recomputes; --recompute none leaves nothing",
              "pass --recompute full, attention or mlp, or leave it out to check all three");
  const int64_t micro = config.batch;
  const int64_t k = std::max<int64_t>(config.accum_steps, 2);
  const ModelFamily& family = model_registry().get(config.model);

  // Dropout forced on for the checkpoint checks, off for the accumulation checks.
  // (A toy problem has no dropout: both stay unset there.)
  RunConfig with_dropout = config;
  RunConfig without_dropout = config;
  if (family.kind != ModelKind::kToy) {
    with_dropout.dropout = kDropoutForCheckpointCheck;
    without_dropout.dropout = 0.0;
    if (config.lora()) {
      with_dropout.lora_dropout = kDropoutForCheckpointCheck;
      without_dropout.lora_dropout = 0.0;
    }
  }
  // The references and the checks of the strategies take the full loss; the chunked-loss checks
  // take the configuration's chunk (kVerifyLossChunk unless it asks for --loss chunked).
  const bool chunked_loss = options.chunked_loss || config.loss == LossKind::kLossChunked;
  const int64_t loss_chunk =
      config.loss == LossKind::kLossChunked ? config.loss_chunk : kVerifyLossChunk;
  for (RunConfig* c : {&with_dropout, &without_dropout}) {
    c->loss = LossKind::kLossFull;
    c->loss_chunk = RunConfig().loss_chunk;
  }
  const nlohmann::json arch_plain = resolve_arch(without_dropout);
  const std::shared_ptr<const DataSource> data = make_data_source(family, arch_plain, config);

  // Whether the model's loss is a language-model head's (what --loss chunked changes).
  std::optional<bool> lm_head;
  const auto has_lm_head = [&] {
    if (!lm_head) lm_head = family.build(arch_plain, config.seed)->has_lm_head();
    return *lm_head;
  };
  check_usage(
      config.loss == LossKind::kLossFull || has_lm_head(),
      fmt::format("--loss chunked needs a language-model head, and {} has none", config.model),
      "verify --loss chunked with llama, nanovlm or modernbert, or leave --loss out");
  // Whether the model's blocks run their attention and MLP branches as sub-layers.
  const auto exposes_sublayers = [&] {
    auto model = family.build(arch_plain, config.seed);
    for (const auto& block : model->blocks())
      if (!block->exposes_sublayers()) return false;
    return !model->blocks().empty();
  };

  std::vector<VerifyCheck> checks;
  const std::vector<Dtype> dtypes = options.dtypes.empty()
                                        ? std::vector<Dtype>{Dtype::kFp32, Dtype::kBf16}
                                        : options.dtypes;
  const bool cpu = torch::Device(config.device).is_cpu();
  for (const Dtype dtype : dtypes) {
    const bool bf16 = dtype == Dtype::kBf16;
    RunConfig dropout_on = with_dropout;
    RunConfig dropout_off = without_dropout;
    dropout_on.dtype = dtype;
    dropout_off.dtype = dtype;
    std::optional<StepResult> ref_dropout, ref_plain, ref_step;
    // The fused step runs the run's optimizer when it supports it, SGD otherwise.
    const auto& fused = fused_optimizers();
    RunConfig stepped = dropout_on;
    if (std::find(fused.begin(), fused.end(), stepped.optimizer) == fused.end())
      stepped.optimizer = "sgd";
    stepped.clip_grad_norm = 0;
    const StrategyShorthand standard{};
    // Accumulation folded into the optimizer state: SGD with momentum, whose fold is exact.
    RunConfig folded = dropout_off;
    folded.optimizer = "sgd";
    folded.opt = {{"momentum", fmt::format("{}", kFoldMomentum)}};
    folded.lr = 0;  // SGD's default for the model
    folded.clip_grad_norm = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string& name = names[i];
      const StrategyShorthand& s = shorthands[i];
      if (s.fused && s.accumulation) {
        // A step against standard training + SGD on the whole effective batch, dropout off
        // (micro-batches draw other masks). The fold sums the micro-batch gradients
        // accumulation sums, in another order, into an update linear in them. In fp32 the
        // parameters agree to their float32 rounding (kFusedTolerance, as the fused step's):
        // an update compared alone would meet that rounding at ulp(p) / |update|, several
        // 1e-6 of it. Under bf16 the micro-batches' products are rounded apart, and the
        // updates agree as accumulation's gradients do (kAccumulationToleranceBf16). Without
        // and with weight decay (which enters the momentum once, with the first micro-batch).
        for (const double decay : {0.0, kFoldWeightDecay}) {
          RunConfig c = folded;
          c.weight_decay = decay;
          const StepResult ref =
              parameter_updates(with_strategy(c, standard, 1, micro * k), data, kFoldSteps, bf16);
          const StepResult got =
              parameter_updates(with_strategy(c, s, k, micro), data, kFoldSteps, bf16);
          const std::string label =
              decay > 0 ? fmt::format("{} (weight decay {:g})", name, decay) : name;
          VerifyCheck check = compare(label, dtype, got, ref, false,
                                      bf16 ? kAccumulationToleranceBf16 : kFusedTolerance, true);
          if (bf16) {
            check.criterion = "updates " + check.criterion.substr(check.criterion.find("relative"));
          } else {
            // Parameters within 1e-6 of |p| would let pass a fold that was left out where the
            // update is below 1e-6 of the parameter. The updates themselves must agree too, to
            // kAccumulationToleranceBf16: far above their float32 rounding (ulp(p) / |update|,
            // a few 1e-6), far below what a micro-batch left out or folded twice changes (1/k).
            const VerifyCheck updates = compare(
                label, dtype,
                parameter_updates(with_strategy(c, s, k, micro), data, kFoldSteps, true),
                parameter_updates(with_strategy(c, standard, 1, micro * k), data, kFoldSteps, true),
                false, kAccumulationToleranceBf16, true);
            if (!updates.passed) {
              check.passed = false;
              check.worst_tensor = updates.worst_tensor + " (update)";
              check.grad_max_rel_diff =
                  std::max(check.grad_max_rel_diff, updates.grad_max_rel_diff);
            }
            check.criterion += fmt::format(", updates <= {:g}", kAccumulationToleranceBf16);
          }
          checks.push_back(check);
        }
      } else if (s.fused) {
        // Parameters after one step against standard + the unfused optimizer. SGD's update is
        // the same arithmetic in either order, bitwise; the others within 1e-6 per tensor.
        if (!ref_step)
          ref_step = one_step(with_strategy(stepped, standard, 1, micro * k), data, true, options);
        const StepResult got =
            one_step(with_strategy(stepped, s, 1, micro * k), data, true, options);
        const bool bitwise = cpu && stepped.optimizer == "sgd";
        checks.push_back(compare(name, dtype, got, *ref_step, bitwise, kFusedTolerance, true));
      } else if (!s.accumulation) {
        if (!ref_dropout)
          ref_dropout =
              one_step(with_strategy(dropout_on, standard, 1, micro * k), data, false, options);
        // Checkpointing is checked under each policy (whole blocks, then each residual branch
        // alone) unless the configuration names one.
        const Recompute given = dropout_on.recompute.value_or(
            dropout_on.checkpoint_policy.value_or(Recompute::kFull));
        std::vector<Recompute> policies = {given};
        if (s.checkpoint && given == Recompute::kFull && exposes_sublayers())
          policies = {Recompute::kFull, Recompute::kAttention,
                      Recompute::kMlp};
        for (const Recompute policy : policies) {
          RunConfig c = with_strategy(dropout_on, s, 1, micro * k);
          c.checkpoint_policy = policy;
          const StepResult got = one_step(c, data, false, options);
          const std::string label = policy == Recompute::kFull
                                        ? name
                                        : name + " (" + recompute_name(policy) + ")";
          // Bitwise on the CPU in fp32: the recompute runs the forward's kernels on the
          // forward's inputs. Under bf16 the gradient parts of a tensor read by several casts
          // may be summed in another order (kRecomputeToleranceCpuBf16).
          const double tolerance =
              bf16 ? (cpu ? kRecomputeToleranceCpuBf16 : kRecomputeToleranceCudaBf16)
                   : kRecomputeToleranceCuda;
          checks.push_back(compare(label, dtype, got, *ref_dropout, cpu && !bf16, tolerance));
        }
      } else {
        if (!ref_plain)
          ref_plain =
              one_step(with_strategy(dropout_off, standard, 1, micro * k), data, false, options);
        const StepResult got =
            one_step(with_strategy(dropout_off, s, k, micro), data, false, options);
        checks.push_back(compare(name, dtype, got, *ref_plain, false,
                                 bf16 ? kAccumulationToleranceBf16 : kAccumulationTolerance));
      }
    }
    if (chunked_loss && has_lm_head()) {
      // Standard and each strategy again with --loss chunked, against the same full-loss
      // reference as above, so a check says what the chunked loss adds to the strategy.
      const double loss_tolerance = bf16 ? kChunkedLossToleranceBf16 : kChunkedLossTolerance;
      const auto chunked = [loss_chunk](RunConfig c) {
        c.loss = LossKind::kLossChunked;
        c.loss_chunk = loss_chunk;
        return c;
      };
      std::vector<std::pair<std::string, StrategyShorthand>> twins = {{"standard", standard}};
      for (size_t i = 0; i < names.size(); ++i) twins.emplace_back(names[i], shorthands[i]);
      std::optional<StepResult> ref_sgd_step;
      for (const auto& [name, s] : twins) {
        const std::string label = fmt::format("{}, loss chunked {}", name, loss_chunk);
        if (s.fused && s.accumulation) continue;  // the fold: checked with the full loss only
        if (s.fused) {
          // The parameters after one step of plain SGD in backward, against standard + SGD:
          // that the in-backward step takes the chunked head's gradients as they come. (With
          // Adam, whose first step is about lr times the gradient's sign, the rounding of
          // gradients near zero is magnified past any tolerance that still means something:
          // 1.8e-5 of a parameter measured on the tiny Llama.) The gradients themselves are
          // checked by the standard twin above.
          RunConfig sgd = stepped;
          sgd.optimizer = "sgd";
          sgd.opt.clear();
          sgd.lr = 0;  // SGD's default for the model
          if (!ref_sgd_step)
            ref_sgd_step =
                one_step(with_strategy(sgd, standard, 1, micro * k), data, true, options);
          const StepResult got =
              one_step(chunked(with_strategy(sgd, s, 1, micro * k)), data, true, options);
          checks.push_back(compare(label, dtype, got, *ref_sgd_step, false,
                                   kFusedTolerance + loss_tolerance, true));
        } else if (!s.accumulation) {
          if (!ref_dropout)
            ref_dropout =
                one_step(with_strategy(dropout_on, standard, 1, micro * k), data, false, options);
          const StepResult got =
              one_step(chunked(with_strategy(dropout_on, s, 1, micro * k)), data, false, options);
          const double recompute_tolerance =
              !s.checkpoint ? 0.0
              : bf16        ? (cpu ? kRecomputeToleranceCpuBf16 : kRecomputeToleranceCudaBf16)
                            : (cpu ? 0.0 : kRecomputeToleranceCuda);
          checks.push_back(compare(label, dtype, got, *ref_dropout, false,
                                   recompute_tolerance + loss_tolerance));
        } else {
          if (!ref_plain)
            ref_plain =
                one_step(with_strategy(dropout_off, standard, 1, micro * k), data, false, options);
          const StepResult got =
              one_step(chunked(with_strategy(dropout_off, s, k, micro)), data, false, options);
          const double accumulation_tolerance =
              bf16 ? kAccumulationToleranceBf16 : kAccumulationTolerance;
          checks.push_back(compare(label, dtype, got, *ref_plain, false,
                                   accumulation_tolerance + loss_tolerance));
        }
      }
    }
    if (options.attention && family.kind != ModelKind::kToy) {
      // Standard and each strategy with --attention sdpa against standard training with
      // --attention math, dropout off (SDPA's dropout draws masks of its own): that the fused
      // kernel computes what the written-out attention does, under every way of taking a step.
      const double attention_tolerance = bf16 ? kAttentionToleranceBf16 : kAttentionTolerance;
      const auto with_attention = [](RunConfig c, Attention a) {
        c.attention = a;
        return c;
      };
      const RunConfig math = with_attention(dropout_off, Attention::kMath);
      const RunConfig sdpa = with_attention(dropout_off, Attention::kSdpa);
      const StepResult ref = one_step(with_strategy(math, standard, 1, micro * k), data, false,
                                      options);
      std::optional<StepResult> ref_sgd_step;
      std::vector<std::pair<std::string, StrategyShorthand>> twins = {{"standard", standard}};
      for (size_t i = 0; i < names.size(); ++i) twins.emplace_back(names[i], shorthands[i]);
      for (const auto& [name, s] : twins) {
        const std::string label = name + ", attention sdpa vs math";
        if (s.fused && s.accumulation) {
          // The fold (SGD with momentum): what one step moved the parameters by.
          const RunConfig c_math = with_attention(folded, Attention::kMath);
          const RunConfig c_sdpa = with_attention(folded, Attention::kSdpa);
          const StepResult fold_ref = parameter_updates(
              with_strategy(c_math, standard, 1, micro * k), data, kFoldSteps, true);
          const StepResult got =
              parameter_updates(with_strategy(c_sdpa, s, k, micro), data, kFoldSteps, true);
          VerifyCheck check = compare(label, dtype, got, fold_ref, false,
                                      kAccumulationToleranceBf16 + attention_tolerance, true);
          check.criterion = "updates " + check.criterion.substr(check.criterion.find("relative"));
          checks.push_back(check);
        } else if (s.fused) {
          // The parameters after one step of plain SGD (as the chunked loss's twin does).
          RunConfig sgd = dropout_off;
          sgd.optimizer = "sgd";
          sgd.opt.clear();
          sgd.lr = 0;
          sgd.clip_grad_norm = 0;
          if (!ref_sgd_step)
            ref_sgd_step = one_step(
                with_strategy(with_attention(sgd, Attention::kMath), standard, 1,
                              micro * k),
                data, true, options);
          const StepResult got = one_step(
              with_strategy(with_attention(sgd, Attention::kSdpa), s, 1, micro * k),
              data, true, options);
          checks.push_back(compare(label, dtype, got, *ref_sgd_step, false,
                                   kFusedTolerance + attention_tolerance, true));
        } else {
          const int64_t n = s.accumulation ? k : 1;
          const StepResult got =
              one_step(with_strategy(sdpa, s, n, micro * k / n), data, false, options);
          const double strategy_tolerance =
              s.accumulation ? (bf16 ? kAccumulationToleranceBf16 : kAccumulationTolerance)
              : !s.checkpoint ? 0.0
              : bf16          ? (cpu ? kRecomputeToleranceCpuBf16 : kRecomputeToleranceCudaBf16)
                              : (cpu ? 0.0 : kRecomputeToleranceCuda);
          checks.push_back(compare(label, dtype, got, ref, false,
                                   strategy_tolerance + attention_tolerance));
        }
      }
      // With dropout on, SDPA on the CPU leaves its fused kernel for a math composition that
      // draws its own masks: a checkpoint's recompute must draw the same ones, bitwise in fp32
      // on the CPU, as the math path's recompute does.
      std::optional<StepResult> ref_sdpa_dropout;
      for (size_t i = 0; i < names.size(); ++i) {
        const StrategyShorthand& s = shorthands[i];
        if (!s.checkpoint || s.accumulation || s.fused) continue;
        const RunConfig on = with_attention(dropout_on, Attention::kSdpa);
        if (!ref_sdpa_dropout)
          ref_sdpa_dropout = one_step(with_strategy(on, standard, 1, micro * k), data, false,
                                      options);
        const StepResult got = one_step(with_strategy(on, s, 1, micro * k), data, false, options);
        const double tolerance =
            bf16 ? (cpu ? kRecomputeToleranceCpuBf16 : kRecomputeToleranceCudaBf16)
                 : kRecomputeToleranceCuda;
        checks.push_back(compare(
            fmt::format("{}, attention sdpa, dropout {:g}", names[i], kDropoutForCheckpointCheck),
            dtype, got, *ref_sdpa_dropout, cpu && !bf16, tolerance));
      }
    }
  }
  return checks;
}

}  // namespace gradscope
