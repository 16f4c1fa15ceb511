#include "gradscope/report/claims.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "gradscope/core/statistics.h"
#include "gradscope/report/claim_quantities.h"

namespace gradscope {

namespace {

// One comparison's tests against the thresholds' two ends.
struct Outcome {
  bool above_low = false, below_low = false, above_high = false, below_high = false;
  double p_low = kNaN, p_high = kNaN;
};

std::vector<double> scaled(std::vector<double> v, double factor) {
  for (double& x : v) x *= factor;
  return v;
}

WelchTest test_against(const ClaimTest& t, double threshold) {
  return t.b ? welch_t_test(t.a, scaled(*t.b, threshold)) : one_sample_t_test(t.a, threshold);
}

bool enough_seeds(const ClaimTest& t) {
  return static_cast<int>(t.a.size()) >= kMinSeeds &&
         (!t.b || static_cast<int>(t.b->size()) >= kMinSeeds);
}

Outcome outcome_of(const ClaimRule& rule, const ClaimTest& t, double alpha) {
  Outcome o;
  const WelchTest lo = test_against(t, rule.thresholds.low);
  o.above_low = lo.above(alpha);
  o.below_low = lo.below(alpha);
  o.p_low = lo.p;
  const ClaimComparison c = rule.thresholds.comparison;
  if (c == ClaimComparison::kWithin || c == ClaimComparison::kOutside) {
    const WelchTest hi = test_against(t, rule.thresholds.high);
    o.above_high = hi.above(alpha);
    o.below_high = hi.below(alpha);
    o.p_high = hi.p;
  }
  return o;
}

bool rule_passes(ClaimComparison c, const Outcome& o) {
  switch (c) {
    case ClaimComparison::kAtLeast:
      return o.above_low;
    case ClaimComparison::kBelow:
      return o.below_low;
    case ClaimComparison::kWithin:
      return o.above_low && o.below_high;
    case ClaimComparison::kOutside:
      return o.below_low || o.above_high;
  }
  return false;
}

bool rule_fails(ClaimComparison c, const Outcome& o) {
  switch (c) {
    case ClaimComparison::kAtLeast:
      return o.below_low;
    case ClaimComparison::kBelow:
      return o.above_low;
    case ClaimComparison::kWithin:
      return o.below_low || o.above_high;
    case ClaimComparison::kOutside:
      return o.above_low && o.below_high;
  }
  return false;
}

std::string outcome_text(const ClaimRule& rule, const ClaimTest& t, const Outcome& o,
                         double alpha) {
  if (!enough_seeds(t))
    return fmt::format("{} vs {} seed(s): fewer than {}, does not count", t.a.size(),
                       t.b ? t.b->size() : t.a.size(), kMinSeeds);
  const ClaimComparison c = rule.thresholds.comparison;
  const char* unit = t.b ? "x" : "";
  std::string p =
      fmt::format("Welch p = {:.3g} against {:.4g}{}", o.p_low, rule.thresholds.low, unit);
  if (c == ClaimComparison::kWithin || c == ClaimComparison::kOutside)
    p += fmt::format(", {:.3g} against {:.4g}{}", o.p_high, rule.thresholds.high, unit);
  p += fmt::format(" (decides below {:.3g})", alpha);
  return p + (rule_passes(c, o) ? ": passes" : rule_fails(c, o) ? ": fails" : ": undecided");
}

Verdict decide(const ClaimRule& rule, ClaimMeasurement& m, int basis, int& too_few) {
  if (m.not_comparable) return Verdict::kNotComparable;
  const ClaimComparison c = rule.thresholds.comparison;
  // Bonferroni: a claim decided by m comparisons tests each at kAlpha / m, so that the
  // claim as a whole errs at most kAlpha (with many cells, some would pass by chance).
  int comparisons = 0;
  for (const ClaimTest& t : m.tests[basis]) comparisons += enough_seeds(t);
  const double alpha = kAlpha / std::max(comparisons, 1);
  int counted = 0, pass = 0, fail = 0, above_high = 0, below_high = 0, above_low = 0, below_low = 0;
  for (const ClaimTest& t : m.tests[basis]) {
    const Outcome o = outcome_of(rule, t, alpha);
    if (t.evidence < m.evidence.size()) {
      Evidence& e = m.evidence[t.evidence];
      std::string& text = basis == 0 ? e.steps : basis == 1 ? e.samples : e.evaluations;
      text += (text.empty() ? "" : "; ") + outcome_text(rule, t, o, alpha);
    }
    if (!enough_seeds(t)) {
      ++too_few;
      continue;
    }
    ++counted;
    pass += rule_passes(c, o);
    fail += rule_fails(c, o);
    above_high += o.above_high;
    below_high += o.below_high;
    above_low += o.above_low;
    below_low += o.below_low;
  }
  if (counted == 0) return Verdict::kNotEnoughData;
  Verdict v = Verdict::kNotEnoughData;
  switch (rule.thresholds.aggregate) {
    case ClaimAggregate::kMedian:
      if (2 * pass > counted) v = Verdict::kReproduced;
      if (2 * fail > counted) v = Verdict::kNotReproduced;
      break;
    case ClaimAggregate::kAny:
      if (fail == counted) v = Verdict::kNotReproduced;
      if (pass > 0) v = Verdict::kReproduced;
      break;
    case ClaimAggregate::kUpTo:
      if (below_high == counted && above_low > 0) v = Verdict::kReproduced;
      if (above_high > 0 || below_low == counted) v = Verdict::kNotReproduced;
      break;
  }
  const std::optional<double>& max_peak = rule.thresholds.max_peak_ratio;
  if (v == Verdict::kReproduced && max_peak && m.peak_ratio > *max_peak)
    v = Verdict::kNotReproduced;
  return v;
}

// Appended to each rule's text: the rule every verdict follows.
std::string seed_rule() {
  return fmt::format(
      " Every comparison is of per-seed values, needs at least {} seeds on each side (fewer: "
      "listed, not counted) and is decided by Welch's t test, two-sided (a paired t test of "
      "per-seed ratios where both sides ran the same seeds and the claim is about their "
      "difference); the claim as a whole at {:.0f}%: each of its m counted comparisons at "
      "p < {:.2f} / m (Bonferroni). With no counted comparison, or none that settles the rule, "
      "the verdict is not enough data.",
      kMinSeeds, 100 * (1 - kAlpha), kAlpha);
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
    case Verdict::kNotComparable:
      return "not comparable here";
    case Verdict::kIndicativeOnly:
      return "indicative only";
  }
  return "?";
}

Axis basis_axis(int basis) {
  return basis == 0 ? Axis::kSteps : basis == 1 ? Axis::kSamples : Axis::kEvaluations;
}

const std::vector<ClaimRule>& study_claims() {
  using Q = ClaimQuantity;
  using C = ClaimComparison;
  using A = ClaimAggregate;
  constexpr auto kNone = std::nullopt;
  // Each row: id, claim, rule; {quantity, treatment, models};
  // {comparison, low, high, aggregate, max peak ratio}.
  static const std::vector<ClaimRule> rules = {
      {"accumulation-vlm",
       "Gradient accumulation lowers the VLM's training loss about 10x, with no extra memory.",
       "nanovlm runs with accumulation against standard runs of the same settings, paired at the "
       "same micro-batch (the study's setup: k times the effective batch) and at the same "
       "effective batch; the same micro-batch decides where the data has it. Per pair, the "
       "standard run's loss is tested against 5 times the accumulation run's (half the claimed "
       "factor): reproduced when more than half the pairs are significantly above, and no "
       "accumulation run needs more than 1.10x the standard run's peak memory; not reproduced "
       "when more than half are significantly below." +
           seed_rule(),
       {Q::kLossRatio, "accumulation", {"nanovlm"}},
       {C::kAtLeast, 5, 0, A::kMedian, 1.10}},
      {"accumulation-lm",
       "Gradient accumulation lowers the LM's training loss about 4x, with no extra memory.",
       "llama runs with accumulation against standard runs of the same settings, paired at the "
       "same micro-batch (the study's setup: k times the effective batch) and at the same "
       "effective batch; the same micro-batch decides where the data has it. Per pair, the "
       "standard run's loss is tested against 2 times the accumulation run's (half the claimed "
       "factor): reproduced when more than half the pairs are significantly above, and no "
       "accumulation run needs more than 1.10x the standard run's peak memory; not reproduced "
       "when more than half are significantly below." +
           seed_rule(),
       {Q::kLossRatio, "accumulation", {"llama"}},
       {C::kAtLeast, 2, 0, A::kMedian, 1.10}},
      {"adam-not-best",
       "Adam is not the best optimizer everywhere.",
       "In each cell (model, strategy and settings other than the optimizer's) with Adam and at "
       "least one other optimizer, each other optimizer's loss is tested against Adam's: "
       "reproduced when one is significantly below Adam in some cell; not reproduced when every "
       "one is significantly above Adam. Optimizers spend different compute per step (a line "
       "search evaluates the batch several times), so the fair verdict is at equal gradient "
       "evaluations; equal training time is shown beside it." +
           seed_rule(),
       {Q::kCellsBeatingAdam, "", {}},
       {C::kBelow, 1, 0, A::kAny, kNone}},
      {"checkpoint-loss",
       "Gradient checkpointing changes the training loss.",
       "Checkpointed runs against standard runs of the same settings: per pair, the ratio of "
       "the checkpointed loss to the standard loss of the same seed is tested against 0.999 "
       "and 1.001 (a paired t test over the seeds both ran): reproduced when some pair is "
       "significantly outside that 0.1% band; not reproduced when every pair is significantly "
       "inside it. Recomputing activations gives the same gradients, so only "
       "floating-point reordering should show." +
           seed_rule(),
       {Q::kLossDifference, "checkpoint", {}},
       {C::kOutside, 0.999, 1.001, A::kAny, kNone}},
      {"checkpoint-time",
       "Gradient checkpointing adds up to 60% training time.",
       "Median step times of checkpointed runs against standard runs of the same settings, per "
       "pair tested against the standard's times 1.15 and 1.75 (a quarter of the claim either "
       "way): reproduced when every pair is significantly below 1.75x and some pair "
       "significantly above 1.15x; not reproduced when a pair is significantly above 1.75x or "
       "every pair significantly below 1.15x." +
           seed_rule(),
       {Q::kStepTimeRatio, "checkpoint", {}},
       {C::kWithin, 1.15, 1.75, A::kUpTo, kNone}},
      {"utilization-lm",
       "Device utilization is 8-15% when training the LM.",
       "GPU utilization only (the study's measure): per llama configuration, the runs' mean "
       "utilization is tested against the claimed range widened by 5 points (3-20%): "
       "reproduced when more than half the configurations are significantly inside, not "
       "reproduced when more than half are significantly outside; with only CPU runs the "
       "verdict is not comparable here." +
           seed_rule(),
       {Q::kMedianUtilization, "", {"llama"}},
       {C::kWithin, 3, 20, A::kMedian, kNone}},
      {"utilization-vision",
       "Device utilization is 96-99% when training the vision model.",
       "GPU utilization only (the study's measure): per vit configuration, the runs' mean "
       "utilization is tested against the claimed range widened by 5 points (91-104%): "
       "reproduced when more than half the configurations are significantly inside, not "
       "reproduced when more than half are significantly outside; with only CPU runs the "
       "verdict is not comparable here." +
           seed_rule(),
       {Q::kMedianUtilization, "", {"vit"}},
       {C::kWithin, 91, 104, A::kMedian, kNone}},
  };
  return rules;
}

Finding evaluate_claim(const GroupedRuns& data, const ClaimRule& rule) {
  ClaimMeasurement m = measure_claim(data, rule);
  Finding f;
  f.id = rule.id;
  f.claim = rule.claim;
  f.rule = rule.rule;
  int too_few = 0;
  f.verdict = decide(rule, m, 0, too_few);
  f.verdict_equal_samples = decide(rule, m, 1, too_few);
  f.verdict_equal_evaluations = decide(rule, m, 2, too_few);
  if (too_few > 0 && !m.not_comparable)
    m.notes.push_back(fmt::format(
        "{} comparison(s) over the three bases have fewer than {} seeds on a side and do not "
        "count: run more seeds (a sweep's seed axis) for a verdict.",
        too_few, kMinSeeds));
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
