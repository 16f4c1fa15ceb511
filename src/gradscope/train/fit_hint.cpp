#include "gradscope/train/fit_hint.h"

#include <algorithm>
#include <map>
#include <tuple>

#include <fmt/format.h>
#include <torch/torch.h>

#include "gradscope/core/error.h"
#include "gradscope/core/settings.h"
#include "gradscope/models/registry.h"
#include "gradscope/optim/factory.h"
#include "gradscope/optim/micro_batch_fold.h"
#include "gradscope/strategy/shard.h"
#include "gradscope/strategy/updater.h"
#include "gradscope/train/estimate.h"
#include "gradscope/train/session.h"

namespace gradscope {
namespace {

// The rule's tiers, cheapest first (fit_hint.h).
enum class Tier { kExact = 1, kRecompute, kChangesTraining, kDevices };

const char* tier_text(Tier t) {
  switch (t) {
    case Tier::kExact:
      return "keeps the math and the compute";
    case Tier::kRecompute:
      return "recomputes";
    case Tier::kChangesTraining:
      return "changes what is trained or its precision";
    case Tier::kDevices:
      return "needs more devices";
  }
  return "";
}

// A method to try: the configuration it makes of the run, and where the rule puts it.
struct Candidate {
  std::string method;
  RunConfig config;
  Tier tier = Tier::kExact;
  double order = 0;  // within the tier, smaller first
};

// `run` with its step computed as `plan` says, written the way the run's own settings are:
// through --strategy and its refinements when the run named a strategy (a later --strategy
// replaces it), else through the settings alone.
RunConfig with_step(RunConfig c, const StepPlan& plan) {
  const bool recompute = plan.recompute != Recompute::kNone;
  c.checkpoint_every = plan.recompute_every;
  c.accum_steps = plan.accum_steps;
  if (c.strategy)
    c.strategy = StrategyShorthand{recompute, c.strategy->accumulation || plan.accum_steps > 1,
                                   plan.optimizer_step == OptimizerStep::kInBackward};
  if (recompute) {
    c.recompute = plan.recompute;
    if (c.checkpoint_policy) c.checkpoint_policy = plan.recompute;
  } else if (c.recompute) {
    c.recompute = Recompute::kNone;
  }
  if (c.optimizer_step || (!c.strategy && plan.optimizer_step != OptimizerStep::kAfterBackward))
    c.optimizer_step = plan.optimizer_step;
  return c;
}

// The flags that turn `run` into `to`, in the settings table's order; nullopt when appending
// flags cannot say it (a setting `to` leaves unset that `run` sets).
std::optional<std::vector<std::string>> flags_between(const RunConfig& run, const RunConfig& to) {
  std::vector<std::string> flags;
  for (const Setting& s : run_settings()) {
    const std::string before = s.text(run), after = s.text(to);
    if (before == after) continue;
    if (after.empty() || s.type == SettingType::kPairs || s.type == SettingType::kFlag)
      return std::nullopt;
    flags.push_back(s.flag());
    flags.push_back(after);
  }
  return flags;
}

// Why the fused step or its folds refuse `c` ("" when they take it), as the updater would
// (strategy/fused.cpp): its optimizers, no clipping, and with micro-batches a state that takes
// a fold (SGD needs momentum). `adama` says whether the fold makes Adam's update AdamA.
std::string in_backward_refusal(const RunConfig& c, const StepPlan& plan, bool& adama) {
  adama = false;
  if (plan.optimizer_step != OptimizerStep::kInBackward) return "";
  if (c.clip_grad_norm != 0) return "clipping needs every gradient before the update";
  const auto& names = plan.micro_batches ? folding_optimizers() : fused_optimizers();
  if (std::find(names.begin(), names.end(), c.optimizer) == names.end())
    return "optimizer '" + c.optimizer + "' does not step in backward this way";
  if (!plan.micro_batches) return "";
  // The fold's own check reads the built optimizer's settings: one over a single element.
  const auto optimizer =
      make_optimizer(c.optimizer, {torch::zeros({1}, torch::requires_grad())},
                     learning_rate_of(c), c.weight_decay, c.opt);
  adama = fold_is_adama(*optimizer);
  return fold_refusal(*optimizer);
}

// Whether gradscope runs `c` at all, checked as the session checks it before training (""
// when it does); `adama` as above.
std::string refusal(const RunConfig& c, bool& adama) {
  adama = false;
  try {
    resolve_run(c);  // the settings, the step plan, the names, the architecture
    const StepPlan plan = c.step_plan();
    const ModelFamily& family = model_registry().get(c.model);
    const bool lm_head = family.kind == ModelKind::kCausalLm ||
                         family.kind == ModelKind::kMaskedLm ||
                         family.kind == ModelKind::kVisionLanguage;
    if (plan.loss == LossKind::kChunked && !lm_head) return "no language-model head";
    if (c.lora() && optimizer_registry().get(c.optimizer).updates_block_matrices)
      return "the optimizer updates the frozen matrices its own way";
    check_shard(plan, c.shard, c.optimizer);
    return in_backward_refusal(c, plan, adama);
  } catch (const std::exception& e) {
    return e.what();
  }
}

// "every block", "every 2nd block", "every 4th block".
std::string every_text(int64_t every) {
  if (every == 1) return "every block";
  return fmt::format("every {}{} block", every, every == 2 ? "nd" : every == 3 ? "rd" : "th");
}

void add_step_methods(const RunConfig& run, std::vector<Candidate>& out) {
  const StepPlan plan = run.step_plan();
  if (plan.loss != LossKind::kChunked) {
    RunConfig c = run;
    c.loss = LossKind::kChunked;
    out.push_back({"chunked loss", c, Tier::kExact, 0});
  }
  // The same effective batch in k times as many micro-batches.
  for (int64_t k : {2, 4, 8}) {
    if (run.batch % k != 0) continue;
    StepPlan p = plan;
    p.accum_steps *= k;
    RunConfig c = with_step(run, p);
    c.batch = run.batch / k;
    out.push_back({fmt::format("accumulation, {} micro-batches of {}", p.accum_steps, c.batch), c,
                   Tier::kExact, 1 + static_cast<double>(k)});
  }
  if (plan.optimizer_step != OptimizerStep::kInBackward) {
    StepPlan p = plan;
    p.optimizer_step = OptimizerStep::kInBackward;
    out.push_back({run.accum_steps > 1 ? "accumulation without a gradient buffer"
                                       : "optimizer step in backward (no gradient buffer)",
                   with_step(run, p), Tier::kExact, 1});
  }
  // Checkpoint policies on every block, every second and every fourth (each choice of blocks
  // once: past the model's depth only block 0 is chosen); ordered by what they recompute once
  // estimated.
  const nlohmann::json arch = resolve_arch(run);
  const auto blocks = static_cast<int64_t>(
      block_forward_flops(run.model, arch, arch.at("seq_len").get<int64_t>()).size());
  for (Recompute r : {Recompute::kAttention, Recompute::kMlp, Recompute::kFull})
    for (int64_t every : {1, 2, 4}) {
      if (every / 2 >= blocks && every > 1) continue;
      if (r == plan.recompute && every == plan.recompute_every) continue;
      StepPlan p = plan;
      p.recompute = r;
      p.recompute_every = every;
      out.push_back({fmt::format("recompute {} in {}", recompute_name(r), every_text(every)),
                     with_step(run, p), Tier::kRecompute, 0});
    }
}

void add_training_methods(const RunConfig& run, std::vector<Candidate>& out) {
  // 8-bit state for the run's own update rule, where its optimizer has such a form, at the
  // run's learning rate.
  if (const char* eight_bit = optimizer_registry().get(run.optimizer).eight_bit_state) {
    RunConfig c = run;
    c.optimizer = eight_bit;
    try {
      if (run.lr == 0 && !run.lr_auto && learning_rate_of(c) != learning_rate_of(run))
        c.lr = learning_rate_of(run);
    } catch (const std::exception&) {
    }
    out.push_back({fmt::format("8-bit optimizer state ({})", eight_bit), c,
                   Tier::kChangesTraining, 0});
  }
  if (!run.lora()) {
    RunConfig c = run;
    c.lora_targets = {"q", "v"};
    out.push_back({"LoRA adapters on q and v", c, Tier::kChangesTraining, 2});
  }
  // Sharded over more ranks, keeping the global batch: each rank's micro-batch a share of it.
  const int64_t global_micro = run.batch * run.nproc;
  for (int64_t n : {2, 4, 8}) {
    if (n <= run.nproc || global_micro % n != 0) continue;
    for (Shard mode : {Shard::kZero1, Shard::kZero2, Shard::kFsdp}) {
      RunConfig c = run;
      c.set_ranks_on_one_host(n);
      c.shard = mode;
      c.batch = global_micro / n;
      out.push_back({fmt::format("{} over {} ranks", shard_name(mode), n), c, Tier::kDevices,
                     static_cast<double>(n * 4 + static_cast<int>(mode))});
    }
  }
}

// The method as the record keeps it, or nullopt when gradscope refuses it, the estimate has no
// model of it, or its flags cannot say it.
std::optional<MemoryMethodFit> try_method(const RunConfig& run, bool run_adama, Candidate& cand,
                                          int64_t data_bytes, int64_t cap_bytes) {
  bool adama = false;
  if (!refusal(cand.config, adama).empty()) return std::nullopt;
  const std::optional<std::vector<std::string>> flags = flags_between(run, cand.config);
  if (!flags || flags->empty()) return std::nullopt;
  MemoryEstimate e;
  try {
    e = estimate_run(cand.config, data_bytes);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  // A sharded step the estimate does not model per rank says nothing of one rank.
  if (cand.config.nproc > 1 && !e.sharded) return std::nullopt;
  if (adama && !run_adama) {
    cand.tier = Tier::kChangesTraining;  // Adam's moments folded per micro-batch: AdamA
    cand.order = 1;
    cand.method += " (AdamA)";
  }
  MemoryMethodFit m;
  m.method = cand.method;
  m.cost = tier_text(cand.tier);
  m.flags = *flags;
  m.estimated_peak_bytes = e.peak_bytes;
  m.fits = e.peak_bytes <= cap_bytes;
  if (cand.config.step_plan().recompute != Recompute::kNone) {
    m.recompute_flops_per_step = e.recompute_flops_per_step;
    if (cand.tier == Tier::kRecompute) cand.order = e.recompute_flops_per_step;
  }
  return m;
}

MemoryLabelBytes label_bytes(const TimelineLabel& label, int64_t bytes) {
  return {component_name(label.component), label.module, label.phase, bytes};
}

}  // namespace

FailureMemory refusal_memory(const MemoryRefusal& refusal) {
  FailureMemory m;
  m.cap_bytes = refusal.cap_bytes;
  m.live_bytes = refusal.live_bytes;
  m.request = label_bytes(refusal.request, refusal.requested_bytes);
  std::vector<std::pair<TimelineLabel, int64_t>> live = refusal.live;
  std::stable_sort(live.begin(), live.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::map<std::string, int64_t> by_component;
  int64_t rest = 0;
  for (size_t i = 0; i < live.size(); ++i) {
    by_component[component_name(live[i].first.component)] += live[i].second;
    if (i < kFailureLiveLabels)
      m.live.push_back(label_bytes(live[i].first, live[i].second));
    else
      rest += live[i].second;
  }
  m.live_rest_bytes = rest;
  for (const auto& [component, bytes] : by_component)
    m.live_by_component.push_back({component, "", "", bytes});
  std::stable_sort(m.live_by_component.begin(), m.live_by_component.end(),
                   [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
  return m;
}

FailureMemory oom_memory(const Session& session, const MemoryMeter& meter) {
  FailureMemory m;
  const RunConfig& c = session.config();
  // Called while the failure is being recorded: nothing here may lose the record.
  try {
    if (session.device().is_cpu() && CpuMemoryTracker::installed()) {
      if (const std::optional<MemoryRefusal> refusal =
              CpuMemoryTracker::install().last_refusal())
        m = refusal_memory(*refusal);
    } else {
      m.reserved_peak_bytes = meter.reserved_peak_bytes();
    }
  } catch (const std::exception&) {
    m = FailureMemory{};
  }
  if (c.memory_cap_bytes <= 0) return m;
  if (!m.cap_bytes) m.cap_bytes = c.memory_cap_bytes;
  try {
    m.fit = fit_within(session.resolved().given, session.data_bytes(), c.memory_cap_bytes);
  } catch (const std::exception&) {
  }
  return m;
}

RunConfig with_flags(RunConfig run, const std::vector<std::string>& flags) {
  check_usage(flags.size() % 2 == 0, "a flag without its value", "pass --flag VALUE pairs");
  for (size_t i = 0; i + 1 < flags.size(); i += 2) {
    const std::string& flag = flags[i];
    const Setting* s = flag.rfind("--", 0) == 0 ? find_setting(flag.substr(2)) : nullptr;
    check_usage(s != nullptr, "unknown flag '" + flag + "'", "use gradscope run's flags");
    s->parse(run, flags[i + 1]);
  }
  return run;
}

MemoryFit fit_within(const RunConfig& run, int64_t data_bytes, int64_t cap_bytes) {
  MemoryFit fit;
  fit.cap_bytes = cap_bytes;
  fit.estimated_peak_bytes = estimate_run(run, data_bytes).peak_bytes;
  // The estimate put the run itself within the cap, and it ran out all the same: what the
  // estimate says fits is no answer then (the hint says so), so none is given.
  if (fit.estimated_peak_bytes <= cap_bytes) return fit;
  // A larger micro-batch than the one that ran out is no answer either.
  fit.max_batch = std::min(max_batch_within(run, data_bytes, cap_bytes), run.batch - 1);

  std::vector<Candidate> candidates;
  add_step_methods(run, candidates);
  add_training_methods(run, candidates);
  struct Tried {
    Tier tier;
    double order;
    size_t index;  // the order the methods were listed in, for ties
    MemoryMethodFit fit;
  };
  bool run_adama = false;
  refusal(run, run_adama);
  std::vector<Tried> tried;
  for (Candidate& cand : candidates)
    if (std::optional<MemoryMethodFit> m =
            try_method(run, run_adama, cand, data_bytes, cap_bytes))
      tried.push_back({cand.tier, cand.order, tried.size(), std::move(*m)});
  std::sort(tried.begin(), tried.end(), [](const Tried& a, const Tried& b) {
    return std::tie(a.tier, a.order, a.index) < std::tie(b.tier, b.order, b.index);
  });
  for (Tried& t : tried) {
    if (!fit.cheapest && t.fit.fits) fit.cheapest = t.fit;
    fit.tried.push_back(std::move(t.fit));
  }
  return fit;
}

}  // namespace gradscope
