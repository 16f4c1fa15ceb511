#include "gradscope/core/config.h"

#include <fmt/format.h>

#include "gradscope/core/error.h"

namespace gradscope {
namespace {

template <typename Enum, size_t N>
std::optional<Enum> parse_named(const std::string& name,
                                const std::pair<Enum, const char*> (&names)[N]) {
  for (const auto& [value, text] : names)
    if (name == text) return value;
  return std::nullopt;
}

template <typename Enum, size_t N>
const char* name_of(Enum value, const std::pair<Enum, const char*> (&names)[N]) {
  for (const auto& [v, text] : names)
    if (v == value) return text;
  return "?";
}

constexpr std::pair<Dtype, const char*> kDtypes[] = {{Dtype::kFp32, "fp32"},
                                                     {Dtype::kBf16, "bf16"}};
constexpr std::pair<LrSchedule, const char*> kSchedules[] = {
    {LrSchedule::kConstant, "constant"}, {LrSchedule::kCosine, "cosine"}};
constexpr std::pair<Recompute, const char*> kRecomputes[] = {
    {Recompute::kNone, "none"},
    {Recompute::kFull, "full"},
    {Recompute::kAttention, "attention"},
    {Recompute::kMlp, "mlp"}};
constexpr std::pair<OptimizerStep, const char*> kOptimizerSteps[] = {
    {OptimizerStep::kAfterBackward, "after-backward"},
    {OptimizerStep::kInBackward, "in-backward"}};
constexpr std::pair<LossKind, const char*> kLossKinds[] = {{LossKind::kFull, "full"},
                                                           {LossKind::kChunked, "chunked"}};
constexpr std::pair<Projections, const char*> kProjections[] = {
    {Projections::kSeparate, "separate"}, {Projections::kPacked, "packed"}};
constexpr std::pair<Attention, const char*> kAttentions[] = {
    {Attention::kAuto, "auto"},
    {Attention::kSdpa, "sdpa"},
    {Attention::kMath, "math"}};
constexpr std::pair<Shard, const char*> kShards[] = {{Shard::kNone, "none"},
                                                     {Shard::kDdp, "ddp"},
                                                     {Shard::kZero1, "zero1"},
                                                     {Shard::kZero2, "zero2"},
                                                     {Shard::kFsdp, "fsdp"}};
constexpr std::pair<GradReduce, const char*> kGradReduces[] = {
    {GradReduce::kAllReduce, "all-reduce"}, {GradReduce::kReduceScatter, "reduce-scatter"}};

}  // namespace

const char* dtype_name(Dtype d) { return name_of(d, kDtypes); }
const char* lr_schedule_name(LrSchedule s) { return name_of(s, kSchedules); }
const char* recompute_name(Recompute r) { return name_of(r, kRecomputes); }
const char* optimizer_step_name(OptimizerStep s) { return name_of(s, kOptimizerSteps); }
const char* loss_kind_name(LossKind k) { return name_of(k, kLossKinds); }
const char* projections_name(Projections p) { return name_of(p, kProjections); }
const char* attention_name(Attention a) { return name_of(a, kAttentions); }
const char* shard_name(Shard s) { return name_of(s, kShards); }
const char* grad_reduce_name(GradReduce g) { return name_of(g, kGradReduces); }

namespace {
template <typename E, size_t N>
std::vector<std::string> names_in(const std::pair<E, const char*> (&names)[N]) {
  std::vector<std::string> out;
  for (const auto& [value, text] : names) out.emplace_back(text);
  return out;
}
}  // namespace

std::vector<std::string> dtype_names() { return names_in(kDtypes); }
std::vector<std::string> lr_schedule_names() { return names_in(kSchedules); }
std::vector<std::string> recompute_names() { return names_in(kRecomputes); }
std::vector<std::string> optimizer_step_names() { return names_in(kOptimizerSteps); }
std::vector<std::string> loss_kind_names() { return names_in(kLossKinds); }
std::vector<std::string> projections_names() { return names_in(kProjections); }
std::vector<std::string> attention_names() { return names_in(kAttentions); }
std::vector<std::string> shard_names() { return names_in(kShards); }
std::optional<Shard> parse_shard(const std::string& name) { return parse_named(name, kShards); }
std::vector<std::string> grad_reduce_names() { return names_in(kGradReduces); }
std::optional<GradReduce> parse_grad_reduce(const std::string& name) {
  return parse_named(name, kGradReduces);
}
std::optional<Dtype> parse_dtype(const std::string& name) { return parse_named(name, kDtypes); }
std::optional<LrSchedule> parse_lr_schedule(const std::string& name) {
  return parse_named(name, kSchedules);
}
std::optional<Recompute> parse_recompute(const std::string& name) {
  return parse_named(name, kRecomputes);
}
std::optional<OptimizerStep> parse_optimizer_step(const std::string& name) {
  return parse_named(name, kOptimizerSteps);
}
std::optional<LossKind> parse_loss_kind(const std::string& name) {
  return parse_named(name, kLossKinds);
}
std::optional<Projections> parse_projections(const std::string& name) {
  return parse_named(name, kProjections);
}
std::optional<Attention> parse_attention(const std::string& name) {
  return parse_named(name, kAttentions);
}

std::string strategy_name(const StrategyShorthand& s) {
  std::string name;
  for (const auto& [on, part] : {std::pair<bool, const char*>{s.checkpoint, "checkpoint"},
                                 {s.accumulation, "accumulation"},
                                 {s.fused, "fused"}})
    if (on) name += (name.empty() ? "" : "+") + std::string(part);
  return name.empty() ? "standard" : name;
}

std::optional<StrategyShorthand> parse_strategy(const std::string& name) {
  if (name == "standard") return StrategyShorthand{};
  // The parts in their one order, each at most once: a name is what strategy_name writes.
  for (int bits = 1; bits < 8; ++bits) {
    const StrategyShorthand s{(bits & 1) != 0, (bits & 2) != 0, (bits & 4) != 0};
    if (strategy_name(s) == name) return s;
  }
  return std::nullopt;
}

const std::vector<StrategyDescription>& strategy_shorthands() {
  static const std::vector<StrategyDescription> list = {
      {"standard", "one forward and one backward over the whole batch, then the optimizer"},
      {"checkpoint",
       "standard, recomputing every k-th block in backward instead of storing it "
       "(--recompute, --checkpoint-every)"},
      {"accumulation",
       "k micro-batches per step, gradients summed, exact per-target mean "
       "(--accum-steps)"},
      {"checkpoint+accumulation", "accumulation with every k-th block recomputed in backward"},
      {"fused",
       "standard, each parameter updated in backward and its gradient freed at once "
       "(--optimizer-step in-backward)"},
      {"accumulation+fused",
       "accumulation without a gradient buffer: each micro-batch's gradient is folded into the "
       "optimizer state in backward and freed (sgd with momentum: exact; adam, adamw: AdamA, "
       "whose second moment sums each micro-batch's squared gradient, not Adam's rule)"},
      {"checkpoint+accumulation+fused",
       "accumulation+fused with every k-th block recomputed in backward"},
  };
  return list;
}

const std::vector<StrategyDescription>& step_options() {
  static const std::vector<StrategyDescription> list = {
      {"--loss chunked",
       fmt::format("a language model's loss head computes its logits --loss-chunk positions at a "
                   "time (default {}), never for the whole batch, and takes their gradients in "
                   "forward while they exist: what it keeps for backward goes from positions x "
                   "vocabulary floats (the logits' gradient) to the gradients of its input and of "
                   "the vocabulary matrix, (positions + vocabulary) x hidden floats, less when the "
                   "positions outnumber the hidden size; the same matrix products; a graph can be "
                   "backpropagated once (llama, nanovlm, modernbert)",
                   RunConfig().loss_chunk)},
      {"--projections packed",
       "q, k and v, and gate and up, as one matrix product each while the parameters stay "
       "separate: fewer, larger products, for a stacked copy of those weights per layer kept for "
       "backward"},
      {"--lora-targets q,v",
       fmt::format("LoRA: the named projections of every block get trainable adapters of rank "
                   "--lora-rank (default {}) and every other weight is frozen: gradients and "
                   "optimizer state only for the adapters, for the same forward and backward "
                   "activations and a model that learns only a low-rank update (llama, "
                   "modernbert, vit, nanovlm's decoder)",
                   RunConfig().lora_rank)},
  };
  return list;
}

const std::vector<std::string>& lora_target_names() {
  static const std::vector<std::string> names = {"q", "k", "v", "o", "gate", "up", "down"};
  return names;
}

std::string StepPlan::strategy_name() const {
  StrategyShorthand s;
  s.checkpoint = recompute != Recompute::kNone;
  s.accumulation = micro_batches;
  s.fused = optimizer_step == OptimizerStep::kInBackward;
  return gradscope::strategy_name(s);
}

StepPlan RunConfig::step_plan_as_given() const {
  try {
    return step_plan();
  } catch (const Error&) {
  }
  StepPlan plan;
  plan.recompute_every = checkpoint_every;
  plan.accum_steps = accum_steps;
  plan.loss = loss;
  plan.loss_chunk = loss_chunk;
  plan.saved_input = saved_input;
  const Recompute policy = checkpoint_policy.value_or(Recompute::kFull);
  if (strategy) {
    plan.recompute = strategy->checkpoint ? recompute.value_or(policy) : Recompute::kNone;
    if (strategy->checkpoint && plan.recompute == Recompute::kNone)
      plan.recompute = policy;
    plan.micro_batches = strategy->accumulation;
    plan.optimizer_step = strategy->fused ? OptimizerStep::kInBackward
                                          : OptimizerStep::kAfterBackward;
  } else {
    plan.recompute = recompute.value_or(Recompute::kNone);
    plan.micro_batches = accum_steps > 1;
    plan.optimizer_step = optimizer_step.value_or(OptimizerStep::kAfterBackward);
  }
  return plan;
}

StepPlan RunConfig::step_plan() const {
  StepPlan plan;
  plan.recompute_every = checkpoint_every;
  plan.accum_steps = accum_steps;
  plan.loss = loss;
  plan.loss_chunk = loss_chunk;
  plan.saved_input = saved_input;
  if (recompute && checkpoint_policy && *recompute != Recompute::kNone)
    check_usage(*checkpoint_policy == *recompute,
                fmt::format("--recompute {} disagrees with --checkpoint-policy {}",
                            recompute_name(*recompute), recompute_name(*checkpoint_policy)),
                "give one of them: --recompute none|full|attention|mlp says it all");
  if (!strategy) {
    plan.recompute = recompute.value_or(Recompute::kNone);
    plan.micro_batches = accum_steps > 1;
    plan.optimizer_step = optimizer_step.value_or(OptimizerStep::kAfterBackward);
    return plan;
  }
  const StrategyShorthand& s = *strategy;
  const std::string name = gradscope::strategy_name(s);
  if (s.checkpoint) {
    check_usage(!recompute || *recompute != Recompute::kNone,
                fmt::format("strategy '{}' recomputes blocks, got --recompute none", name),
                "pass --recompute full, attention or mlp, or a strategy without checkpoint");
    plan.recompute = recompute ? *recompute : checkpoint_policy.value_or(Recompute::kFull);
  } else {
    check_usage(!recompute || *recompute == Recompute::kNone,
                fmt::format("strategy '{}' recomputes nothing, got --recompute {}", name,
                            recompute ? recompute_name(*recompute) : ""),
                "leave --strategy out (the settings then say how a step is computed), or use a "
                "checkpoint strategy");
  }
  check_usage(s.accumulation || accum_steps == 1,
              fmt::format("strategy '{}' computes a step in one batch, got --accum-steps {}", name,
                          accum_steps),
              "use --accum-steps 1, or a strategy that accumulates micro-batches (or leave "
              "--strategy out)");
  plan.micro_batches = s.accumulation;
  const OptimizerStep step = s.fused ? OptimizerStep::kInBackward
                                     : OptimizerStep::kAfterBackward;
  check_usage(!optimizer_step || *optimizer_step == step,
              fmt::format("strategy '{}' steps the optimizer {}, got --optimizer-step {}", name,
                          optimizer_step_name(step),
                          optimizer_step ? optimizer_step_name(*optimizer_step) : ""),
              "leave --optimizer-step out, or --strategy out");
  plan.optimizer_step = step;
  return plan;
}

std::pair<int64_t, int64_t> memory_window_steps(const RunConfig& c) {
  const int64_t total = c.warmup_steps + c.steps;
  if (c.memory_steps.empty()) return {c.warmup_steps + 1, c.warmup_steps + 1};
  const auto number = [&](const std::string& text) -> int64_t {
    const bool digits = !text.empty() && text.size() <= 12 &&
                        text.find_first_not_of("0123456789") == std::string::npos;
    return digits ? std::stoll(text) : -1;
  };
  const size_t dash = c.memory_steps.find('-');
  const int64_t first = number(c.memory_steps.substr(0, dash));
  const int64_t last =
      dash == std::string::npos ? first : number(c.memory_steps.substr(dash + 1));
  check_usage(first >= 1 && last >= first && last <= total,
              fmt::format("--memory-steps {:.60} is not A or A-B with 1 <= A <= B <= {} (the "
                          "warm-up and timed steps)",
                          c.memory_steps, total),
              "write e.g. --memory-steps 3, or 3-4 for two steps");
  return {first, last};
}

}  // namespace gradscope
