#include "gradscope/report/claims.h"

#include <utility>

#include "gradscope/report/claim_quantities.h"

namespace gradscope {

namespace {

bool passes(const ClaimRule& rule, double v) {
  switch (rule.thresholds.comparison) {
    case ClaimComparison::kAtLeast:
      return v >= rule.thresholds.low;
    case ClaimComparison::kAbove:
      return v > rule.thresholds.low;
    case ClaimComparison::kWithin:
      return v >= rule.thresholds.low && v <= rule.thresholds.high;
  }
  return false;
}

Verdict decide(const ClaimRule& rule, const ClaimMeasurement& m, int basis) {
  if (!m.value[basis] || m.too_close[basis]) return Verdict::kNotEnoughData;
  const std::optional<double>& max_peak = rule.thresholds.max_peak_ratio;
  const bool memory_ok = !max_peak || m.peak_ratio <= *max_peak;
  return passes(rule, *m.value[basis]) && memory_ok ? Verdict::kReproduced
                                                    : Verdict::kNotReproduced;
}

}  // namespace

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kReproduced:
      return "reproduced";
    case Verdict::kNotReproduced:
      return "not reproduced";
    case Verdict::kNotEnoughData:
      return "not enough data";
  }
  return "?";
}

const std::vector<ClaimRule>& study_claims() {
  using Q = ClaimQuantity;
  using C = ClaimComparison;
  constexpr auto kNone = std::nullopt;
  // Each row: id, claim, rule; {quantity, treatment, models};
  // {comparison, low, high, pair threshold, max peak ratio}.
  static const std::vector<ClaimRule> rules = {
      {"accumulation-vlm",
       "Gradient accumulation lowers the VLM's training loss about 10x, with no extra memory.",
       "nanovlm runs with accumulation against standard runs of the same settings, at the same "
       "micro-batch (the study's setup) and at the same effective batch: reproduced when the "
       "median loss ratio (standard / accumulation) is at least 5 (half the claimed factor) and "
       "no accumulation run needs more than 1.10x the standard run's peak memory.",
       {Q::kLossRatio, "accumulation", {"nanovlm"}},
       {C::kAtLeast, 5, 0, 5.0, 1.10}},
      {"accumulation-lm",
       "Gradient accumulation lowers the LM's training loss about 4x, with no extra memory.",
       "llama runs with accumulation against standard runs of the same settings, at the same "
       "micro-batch (the study's setup) and at the same effective batch: reproduced when the "
       "median loss ratio (standard / accumulation) is at least 2 (half the claimed factor) and "
       "no accumulation run needs more than 1.10x the standard run's peak memory.",
       {Q::kLossRatio, "accumulation", {"llama"}},
       {C::kAtLeast, 2, 0, 2.0, 1.10}},
      {"adam-not-best",
       "Adam is not the best optimizer everywhere.",
       "In each cell (model, strategy and settings other than the optimizer's) with Adam and at "
       "least one other optimizer, the lowest loss at equal steps (and at equal samples) wins: "
       "reproduced when another optimizer beats Adam in at least one cell by more than their "
       "95% intervals; not reproduced when Adam wins every cell.",
       {Q::kCellsBeatingAdam, "", {}},
       {C::kAtLeast, 1, 0, kNone, kNone}},
      {"checkpoint-loss",
       "Gradient checkpointing changes the training loss.",
       "Checkpointed runs against standard runs of the same settings, seed by seed where both "
       "ran the same seeds: reproduced when the loss differs by more than 0.1% (relative) in "
       "any pair; recomputing activations gives the same gradients, so only floating-point "
       "reordering should show.",
       {Q::kLossDifference, "checkpoint", {}},
       {C::kAbove, 1e-3, 0, kNone, kNone}},
      {"checkpoint-time",
       "Gradient checkpointing adds up to 60% training time.",
       "Median step time of checkpointed runs against standard runs of the same settings: "
       "reproduced when every pair's overhead is at most 75% (the claim plus a quarter of it) "
       "and the largest is at least 15% (a quarter of it).",
       {Q::kStepTimeRatio, "checkpoint", {}},
       {C::kWithin, 1.15, 1.75, 1.75, kNone}},
      {"utilization-lm",
       "Device utilization is 8-15% when training the LM.",
       "The median of the llama runs' mean utilization: reproduced when within the claimed "
       "range widened by 5 points (3-20%).",
       {Q::kMedianUtilization, "", {"llama"}},
       {C::kWithin, 3, 20, kNone, kNone}},
      {"utilization-vision",
       "Device utilization is 96-99% when training the vision model.",
       "The median of the vit runs' mean utilization: reproduced when within the claimed range "
       "widened by 5 points (91-104%).",
       {Q::kMedianUtilization, "", {"vit"}},
       {C::kWithin, 91, 104, kNone, kNone}},
  };
  return rules;
}

Finding evaluate_claim(const GroupedRuns& data, const ClaimRule& rule) {
  ClaimMeasurement m = measure_claim(data, rule);
  Finding f;
  f.id = rule.id;
  f.claim = rule.claim;
  f.rule = rule.rule;
  f.verdict = decide(rule, m, 0);
  f.verdict_equal_samples = decide(rule, m, 1);
  f.measured = std::move(m.measured);
  f.evidence = std::move(m.evidence);
  f.notes = std::move(m.notes);
  return f;
}

std::vector<Finding> evaluate_claims(const GroupedRuns& data) {
  std::vector<Finding> findings;
  for (const ClaimRule& rule : study_claims()) findings.push_back(evaluate_claim(data, rule));
  return findings;
}

}  // namespace gradscope
