#include "gradscope/train/verify.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/models/registry.h"
#include "gradscope/optim/factory.h"
#include "gradscope/strategy/fused.h"
#include "gradscope/train/autocast.h"
#include "gradscope/train/session.h"
#include "gradscope/train/verify_parts.h"

namespace gradscope {
namespace {

using verify_parts::kAccumulationTolerance;
using verify_parts::kAccumulationToleranceBf16;
using verify_parts::kReferenceOptimizer;
using verify_parts::nonzero_adapters;
using verify_parts::NullObserver;

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

// --saved-input bf16: a checkpoint keeps its input rounded to bfloat16, at most 2^-9 relative
// per element (half of bfloat16's 2^-8 spacing), and the recompute in backward runs from the
// rounded input while the forward, and so the loss, ran on the exact one. The gradients are
// then those of the block at a point within that rounding: each element of the recomputed
// activations, and of the gradients made from them, moves by a few units of 2^-9 (a block's
// products and norms each pass a relative error on, scaled by at most a few), norm-wise well
// under bf16 accumulation's 2e-2 (measured on the tiny models: docs/strategies.md), while a
// recompute from the wrong input (another block's, or zeros) is off by O(1). The loss itself
// agrees bitwise. Under bf16 autocast it adds to the recompute's own tolerance.
constexpr double kSavedInputTolerance = kAccumulationToleranceBf16;

// Positions per chunk when the configuration names none: a prime, so that the chunks divide no
// batch of the presets and the last chunk of each forward is a partial one.
constexpr int64_t kVerifyLossChunk = 37;

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

}  // namespace

std::vector<VerifyCheck> verify_strategies(const RunConfig& config,
                                           const std::vector<std::string>& strategies) {
  VerifyOptions options;
  options.strategies = strategies;
  return verify_strategies(config, options);
}

namespace {

// What every check of `verify_strategies` shares: the strategies asked for, the configurations
// of the references, the data, and the references computed so far (each once per dtype).
class StrategyChecks {
 public:
  StrategyChecks(const RunConfig& config, const VerifyOptions& options);

  // The checks of one dtype, in the order `gradscope verify` prints them.
  void run(Dtype dtype, std::vector<VerifyCheck>& checks);

 private:
  void parse_names();
  void prepare_configs();
  void check_fold(const std::string& name, const StrategyShorthand& s);
  void check_fused(const std::string& name, const StrategyShorthand& s);
  void check_recompute(const std::string& name, const StrategyShorthand& s);
  void check_accumulation(const std::string& name, const StrategyShorthand& s);
  void check_saved_input();
  void check_chunked_loss();
  void check_chunked_twin(const std::string& name, const StrategyShorthand& s, int64_t chunk,
                          std::optional<StepResult>& ref_sgd_step);
  void check_attention();
  void check_attention_twin(const std::string& name, const StrategyShorthand& s,
                            const StepResult& ref, std::optional<StepResult>& ref_sgd_step);
  void check_attention_dropout();

  // The standard references of this dtype: dropout on, dropout off, one optimizer step.
  const StepResult& ref_dropout();
  const StepResult& ref_plain();
  // One step of `c` under `s`, the effective batch split into `n` micro-batches.
  StepResult step(const RunConfig& c, const StrategyShorthand& s, int64_t n,
                  bool optimizer_step) const {
    return one_step(with_strategy(c, s, n, micro_ * k_ / n), data_, optimizer_step, options_);
  }
  // A recompute's own tolerance where it is not bitwise (under bf16, or on CUDA).
  double recompute_tolerance() const;
  double accumulation_tolerance() const {
    return bf16_ ? kAccumulationToleranceBf16 : kAccumulationTolerance;
  }
  // Standard, then each strategy asked for.
  std::vector<std::pair<std::string, StrategyShorthand>> twins() const;
  bool exposes_sublayers() const;
  bool has_lm_head() const;

  const RunConfig& config_;
  const VerifyOptions& options_;
  const ModelFamily& family_;
  std::vector<std::string> names_;
  std::vector<StrategyShorthand> shorthands_;
  int64_t micro_ = 0;
  int64_t k_ = 0;
  bool cpu_ = true;
  bool chunked_loss_ = false;
  int64_t loss_chunk_ = kVerifyLossChunk;
  // Dropout forced on for the recompute checks, off for the accumulation checks. (A toy
  // problem has no dropout: both stay unset there.)
  RunConfig with_dropout_, without_dropout_;
  nlohmann::json arch_plain_;
  std::shared_ptr<const DataSource> data_;
  mutable std::optional<bool> lm_head_;

  // This dtype's configurations and references.
  Dtype dtype_ = Dtype::kFp32;
  bool bf16_ = false;
  RunConfig dropout_on_, dropout_off_, stepped_, folded_;
  std::optional<StepResult> ref_dropout_, ref_plain_, ref_step_;
  std::vector<VerifyCheck>* checks_ = nullptr;
};

StrategyChecks::StrategyChecks(const RunConfig& config, const VerifyOptions& options)
    : config_(config), options_(options), family_(model_registry().get(config.model)) {
  parse_names();
  check_usage(!config.recompute || *config.recompute != Recompute::kNone,
              "verify checks what checkpointing recomputes; --recompute none leaves nothing",
              "pass --recompute full, attention or mlp, or leave it out to check all three");
  micro_ = config.batch;
  k_ = std::max<int64_t>(config.accum_steps, 2);
  cpu_ = torch::Device(config.device).is_cpu();
  prepare_configs();
  check_usage(
      config.loss == LossKind::kFull || has_lm_head(),
      fmt::format("--loss chunked needs a language-model head, and {} has none", config.model),
      "verify --loss chunked with llama, nanovlm or modernbert, or leave --loss out");
}

void StrategyChecks::parse_names() {
  names_ = options_.strategies;
  if (names_.empty())
    for (const auto& s : strategy_shorthands())
      if (s.name != "standard") names_.push_back(s.name);
  for (const auto& n : names_) {  // unknown names fail before any work
    const auto s = parse_strategy(n);
    if (!s) {
      std::string valid;
      for (const auto& d : strategy_shorthands()) valid += (valid.empty() ? "" : ", ") + d.name;
      fail_usage("unknown strategy '" + n + "'", "valid strategies: " + valid);
    }
    shorthands_.push_back(*s);
  }
}

void StrategyChecks::prepare_configs() {
  with_dropout_ = config_;
  without_dropout_ = config_;
  if (family_.kind != ModelKind::kToy) {
    with_dropout_.dropout = kDropoutForCheckpointCheck;
    without_dropout_.dropout = 0.0;
    if (config_.lora()) {
      with_dropout_.lora_dropout = kDropoutForCheckpointCheck;
      without_dropout_.lora_dropout = 0.0;
    }
  }
  // The references and the checks of the strategies take the full loss and keep a
  // checkpoint's input as computed; the chunked-loss checks take the configuration's chunk
  // (kVerifyLossChunk unless it asks for --loss chunked), the saved-input check bf16.
  chunked_loss_ = options_.chunked_loss || config_.loss == LossKind::kChunked;
  if (config_.loss == LossKind::kChunked) loss_chunk_ = config_.loss_chunk;
  for (RunConfig* c : {&with_dropout_, &without_dropout_}) {
    c->loss = LossKind::kFull;
    c->loss_chunk = RunConfig().loss_chunk;
    c->saved_input = Dtype::kFp32;
  }
  arch_plain_ = resolve_arch(without_dropout_);
  data_ = make_data_source(family_, arch_plain_, config_);
}

bool StrategyChecks::has_lm_head() const {
  // Whether the model's loss is a language-model head's (what --loss chunked changes).
  if (!lm_head_) lm_head_ = family_.build(arch_plain_, config_.seed)->has_lm_head();
  return *lm_head_;
}

bool StrategyChecks::exposes_sublayers() const {
  // Whether the model's blocks run their attention and MLP branches as sub-layers.
  auto model = family_.build(arch_plain_, config_.seed);
  for (const auto& block : model->blocks())
    if (!block->exposes_sublayers()) return false;
  return !model->blocks().empty();
}

double StrategyChecks::recompute_tolerance() const {
  if (bf16_) return cpu_ ? kRecomputeToleranceCpuBf16 : kRecomputeToleranceCudaBf16;
  return kRecomputeToleranceCuda;
}

const StepResult& StrategyChecks::ref_dropout() {
  if (!ref_dropout_) ref_dropout_ = step(dropout_on_, StrategyShorthand{}, 1, false);
  return *ref_dropout_;
}

const StepResult& StrategyChecks::ref_plain() {
  if (!ref_plain_) ref_plain_ = step(dropout_off_, StrategyShorthand{}, 1, false);
  return *ref_plain_;
}

std::vector<std::pair<std::string, StrategyShorthand>> StrategyChecks::twins() const {
  std::vector<std::pair<std::string, StrategyShorthand>> out = {{"standard", {}}};
  for (size_t i = 0; i < names_.size(); ++i) out.emplace_back(names_[i], shorthands_[i]);
  return out;
}

void StrategyChecks::run(Dtype dtype, std::vector<VerifyCheck>& checks) {
  dtype_ = dtype;
  bf16_ = dtype == Dtype::kBf16;
  checks_ = &checks;
  dropout_on_ = with_dropout_;
  dropout_off_ = without_dropout_;
  dropout_on_.dtype = dtype;
  dropout_off_.dtype = dtype;
  ref_dropout_.reset();
  ref_plain_.reset();
  ref_step_.reset();
  // The fused step runs the run's optimizer when it supports it, the reference one otherwise.
  const auto& fused = fused_optimizers();
  stepped_ = dropout_on_;
  if (std::find(fused.begin(), fused.end(), stepped_.optimizer) == fused.end())
    stepped_.optimizer = kReferenceOptimizer;
  stepped_.clip_grad_norm = 0;
  // Accumulation folded into the optimizer state: SGD with momentum, whose fold is exact.
  folded_ = dropout_off_;
  folded_.optimizer = kReferenceOptimizer;
  folded_.opt = {{"momentum", fmt::format("{}", kFoldMomentum)}};
  folded_.lr = 0;  // SGD's default for the model
  folded_.clip_grad_norm = 0;
  for (size_t i = 0; i < names_.size(); ++i) {
    const StrategyShorthand& s = shorthands_[i];
    if (s.fused && s.accumulation)
      check_fold(names_[i], s);
    else if (s.fused)
      check_fused(names_[i], s);
    else if (!s.accumulation)
      check_recompute(names_[i], s);
    else
      check_accumulation(names_[i], s);
  }
  if (chunked_loss_ && has_lm_head()) check_chunked_loss();
  if (options_.attention && family_.kind != ModelKind::kToy) check_attention();
  check_saved_input();
}

void StrategyChecks::check_fold(const std::string& name, const StrategyShorthand& s) {
  // A step against standard training + SGD on the whole effective batch, dropout off
  // (micro-batches draw other masks). The fold sums the micro-batch gradients accumulation
  // sums, in another order, into an update linear in them. In fp32 the parameters agree to
  // their float32 rounding (kFusedTolerance, as the fused step's): an update compared alone
  // would meet that rounding at ulp(p) / |update|, several 1e-6 of it. Under bf16 the
  // micro-batches' products are rounded apart, and the updates agree as accumulation's
  // gradients do (kAccumulationToleranceBf16). Without and with weight decay (which enters the
  // momentum once, with the first micro-batch).
  const StrategyShorthand standard{};
  for (const double decay : {0.0, kFoldWeightDecay}) {
    RunConfig c = folded_;
    c.weight_decay = decay;
    const auto updates = [&](const StrategyShorthand& which, int64_t n, bool moved) {
      return parameter_updates(with_strategy(c, which, n, micro_ * k_ / n), data_, kFoldSteps,
                               moved);
    };
    const std::string label =
        decay > 0 ? fmt::format("{} (weight decay {:g})", name, decay) : name;
    const StepResult ref = updates(standard, 1, bf16_);
    VerifyCheck check = compare(label, dtype_, updates(s, k_, bf16_), ref, false,
                                bf16_ ? kAccumulationToleranceBf16 : kFusedTolerance, true);
    if (bf16_) {
      check.criterion = "updates " + check.criterion.substr(check.criterion.find("relative"));
    } else {
      // Parameters within 1e-6 of |p| would let pass a fold that was left out where the
      // update is below 1e-6 of the parameter. The updates themselves must agree too, to
      // kAccumulationToleranceBf16: far above their float32 rounding (ulp(p) / |update|, a few
      // 1e-6), far below what a micro-batch left out or folded twice changes (1/k).
      const VerifyCheck moved = compare(label, dtype_, updates(s, k_, true),
                                        updates(standard, 1, true), false,
                                        kAccumulationToleranceBf16, true);
      if (!moved.passed) {
        check.passed = false;
        check.worst_tensor = moved.worst_tensor + " (update)";
        check.grad_max_rel_diff = std::max(check.grad_max_rel_diff, moved.grad_max_rel_diff);
      }
      check.criterion += fmt::format(", updates <= {:g}", kAccumulationToleranceBf16);
    }
    checks_->push_back(check);
  }
}

void StrategyChecks::check_fused(const std::string& name, const StrategyShorthand& s) {
  // Parameters after one step against standard + the unfused optimizer: bitwise for an
  // optimizer whose entry says its step in backward is the same arithmetic (SGD's), the others
  // within 1e-6 per tensor.
  if (!ref_step_) ref_step_ = step(stepped_, StrategyShorthand{}, 1, true);
  const StepResult got = step(stepped_, s, 1, true);
  const bool bitwise =
      cpu_ && optimizer_registry().get(stepped_.optimizer).same_bits_in_backward;
  checks_->push_back(compare(name, dtype_, got, *ref_step_, bitwise, kFusedTolerance, true));
}

void StrategyChecks::check_recompute(const std::string& name, const StrategyShorthand& s) {
  // Checkpointing is checked under each policy (whole blocks, then each residual branch
  // alone) unless the configuration names one.
  const Recompute given =
      dropout_on_.recompute.value_or(dropout_on_.checkpoint_policy.value_or(Recompute::kFull));
  std::vector<Recompute> policies = {given};
  if (s.checkpoint && given == Recompute::kFull && exposes_sublayers())
    policies = {Recompute::kFull, Recompute::kAttention, Recompute::kMlp};
  const StepResult& ref = ref_dropout();
  for (const Recompute policy : policies) {
    RunConfig c = with_strategy(dropout_on_, s, 1, micro_ * k_);
    c.checkpoint_policy = policy;
    const StepResult got = one_step(c, data_, false, options_);
    const std::string label =
        policy == Recompute::kFull ? name : name + " (" + recompute_name(policy) + ")";
    // Bitwise on the CPU in fp32: the recompute runs the forward's kernels on the forward's
    // inputs. Under bf16 the gradient parts of a tensor read by several casts may be summed
    // in another order (kRecomputeToleranceCpuBf16).
    checks_->push_back(compare(label, dtype_, got, ref, cpu_ && !bf16_, recompute_tolerance()));
  }
}

void StrategyChecks::check_accumulation(const std::string& name, const StrategyShorthand& s) {
  const StepResult& ref = ref_plain();
  const StepResult got = step(dropout_off_, s, k_, false);
  checks_->push_back(compare(name, dtype_, got, ref, false, accumulation_tolerance()));
}

void StrategyChecks::check_saved_input() {
  // --saved-input bf16, whole blocks checkpointed, against the same reference as checkpoint,
  // dropout on: a lossy method, within kSavedInputTolerance plus the recompute's own.
  const bool asked = options_.saved_input || config_.saved_input == Dtype::kBf16;
  for (size_t i = 0; i < names_.size() && asked; ++i) {
    const StrategyShorthand& s = shorthands_[i];
    if (!s.checkpoint || s.accumulation || s.fused) continue;
    RunConfig c = dropout_on_;
    c.saved_input = Dtype::kBf16;
    const StepResult& ref = ref_dropout();
    const double recompute = cpu_ && !bf16_ ? 0.0 : recompute_tolerance();
    VerifyCheck check = compare(names_[i] + ", saved input bf16", dtype_, step(c, s, 1, false),
                                ref, false, kSavedInputTolerance + recompute);
    // The forward runs on the input as computed: its loss is the checkpoint's, so only the
    // recompute's own tolerance (0 in fp32 on the CPU) applies to it, not the gradients' bound.
    if (!(check.loss_rel_diff <= recompute)) check.passed = false;  // NaN fails too
    checks_->push_back(std::move(check));
  }
}

void StrategyChecks::check_chunked_loss() {
  // Standard and each strategy again with --loss chunked, against the same full-loss
  // reference as above, so a check says what the chunked loss adds to the strategy.
  std::optional<StepResult> ref_sgd_step;
  for (const auto& [name, s] : twins()) {
    if (s.fused && s.accumulation) continue;  // the fold: checked with the full loss only
    check_chunked_twin(name, s, loss_chunk_, ref_sgd_step);
  }
}

void StrategyChecks::check_chunked_twin(const std::string& name, const StrategyShorthand& s,
                                        int64_t chunk, std::optional<StepResult>& ref_sgd_step) {
  const double loss_tolerance = bf16_ ? kChunkedLossToleranceBf16 : kChunkedLossTolerance;
  const auto chunked = [chunk](RunConfig c) {
    c.loss = LossKind::kChunked;
    c.loss_chunk = chunk;
    return c;
  };
  const std::string label = fmt::format("{}, loss chunked {}", name, chunk);
  if (s.fused) {
    // The parameters after one step of plain SGD in backward, against standard + SGD: that the
    // in-backward step takes the chunked head's gradients as they come. (With Adam, whose
    // first step is about lr times the gradient's sign, the rounding of gradients near zero
    // is magnified past any tolerance that still means something: 1.8e-5 of a parameter
    // measured on the tiny Llama.) The gradients themselves are checked by the standard twin.
    RunConfig sgd = stepped_;
    sgd.optimizer = kReferenceOptimizer;
    sgd.opt.clear();
    sgd.lr = 0;  // SGD's default for the model
    if (!ref_sgd_step) ref_sgd_step = step(sgd, StrategyShorthand{}, 1, true);
    checks_->push_back(compare(label, dtype_, step(chunked(sgd), s, 1, true), *ref_sgd_step,
                               false, kFusedTolerance + loss_tolerance, true));
  } else if (!s.accumulation) {
    const double tolerance = !s.checkpoint ? 0.0 : cpu_ && !bf16_ ? 0.0 : recompute_tolerance();
    const StepResult& ref = ref_dropout();
    checks_->push_back(compare(label, dtype_, step(chunked(dropout_on_), s, 1, false), ref,
                               false, tolerance + loss_tolerance));
  } else {
    const StepResult& ref = ref_plain();
    checks_->push_back(compare(label, dtype_, step(chunked(dropout_off_), s, k_, false), ref,
                               false, accumulation_tolerance() + loss_tolerance));
  }
}

RunConfig with_attention(RunConfig c, Attention a) {
  c.attention = a;
  return c;
}

void StrategyChecks::check_attention() {
  // Standard and each strategy with --attention sdpa against standard training with
  // --attention math, dropout off (SDPA's dropout draws masks of its own): that the fused
  // kernel computes what the written-out attention does, under every way of taking a step.
  const StepResult ref =
      step(with_attention(dropout_off_, Attention::kMath), StrategyShorthand{}, 1, false);
  std::optional<StepResult> ref_sgd_step;
  for (const auto& [name, s] : twins()) check_attention_twin(name, s, ref, ref_sgd_step);
  check_attention_dropout();
}

void StrategyChecks::check_attention_twin(const std::string& name, const StrategyShorthand& s,
                                          const StepResult& ref,
                                          std::optional<StepResult>& ref_sgd_step) {
  const double attention_tolerance = bf16_ ? kAttentionToleranceBf16 : kAttentionTolerance;
  const std::string label = name + ", attention sdpa vs math";
  if (s.fused && s.accumulation) {
    // The fold (SGD with momentum): what one step moved the parameters by.
    const StepResult fold_ref = parameter_updates(
        with_strategy(with_attention(folded_, Attention::kMath), StrategyShorthand{}, 1,
                      micro_ * k_),
        data_, kFoldSteps, true);
    const StepResult got = parameter_updates(
        with_strategy(with_attention(folded_, Attention::kSdpa), s, k_, micro_), data_,
        kFoldSteps, true);
    VerifyCheck check = compare(label, dtype_, got, fold_ref, false,
                                kAccumulationToleranceBf16 + attention_tolerance, true);
    check.criterion = "updates " + check.criterion.substr(check.criterion.find("relative"));
    checks_->push_back(check);
  } else if (s.fused) {
    // The parameters after one step of plain SGD (as the chunked loss's twin does).
    RunConfig sgd = dropout_off_;
    sgd.optimizer = kReferenceOptimizer;
    sgd.opt.clear();
    sgd.lr = 0;
    sgd.clip_grad_norm = 0;
    if (!ref_sgd_step)
      ref_sgd_step = step(with_attention(sgd, Attention::kMath), StrategyShorthand{}, 1, true);
    checks_->push_back(compare(label, dtype_,
                               step(with_attention(sgd, Attention::kSdpa), s, 1, true),
                               *ref_sgd_step, false, kFusedTolerance + attention_tolerance,
                               true));
  } else {
    const int64_t n = s.accumulation ? k_ : 1;
    const double strategy_tolerance = s.accumulation ? accumulation_tolerance()
                                      : !s.checkpoint ? 0.0
                                      : cpu_ && !bf16_ ? 0.0
                                                       : recompute_tolerance();
    checks_->push_back(compare(label, dtype_,
                               step(with_attention(dropout_off_, Attention::kSdpa), s, n, false),
                               ref, false, strategy_tolerance + attention_tolerance));
  }
}

void StrategyChecks::check_attention_dropout() {
  // With dropout on, SDPA on the CPU leaves its fused kernel for a math composition that
  // draws its own masks: a checkpoint's recompute must draw the same ones, bitwise in fp32
  // on the CPU, as the math path's recompute does.
  std::optional<StepResult> ref;
  const RunConfig on = with_attention(dropout_on_, Attention::kSdpa);
  for (size_t i = 0; i < names_.size(); ++i) {
    const StrategyShorthand& s = shorthands_[i];
    if (!s.checkpoint || s.accumulation || s.fused) continue;
    if (!ref) ref = step(on, StrategyShorthand{}, 1, false);
    checks_->push_back(compare(
        fmt::format("{}, attention sdpa, dropout {:g}", names_[i], kDropoutForCheckpointCheck),
        dtype_, step(on, s, 1, false), *ref, cpu_ && !bf16_, recompute_tolerance()));
  }
}

}  // namespace

std::vector<VerifyCheck> verify_strategies(const RunConfig& config, const VerifyOptions& options) {
  StrategyChecks strategies(config, options);
  std::vector<VerifyCheck> checks;
  const std::vector<Dtype> dtypes = options.dtypes.empty()
                                        ? std::vector<Dtype>{Dtype::kFp32, Dtype::kBf16}
                                        : options.dtypes;
  for (const Dtype dtype : dtypes) strategies.run(dtype, checks);
  return checks;
}

}  // namespace gradscope
