#include "gradscope/report/claims.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "gradscope/core/statistics.h"
#include "gradscope/report/claim_quantities.h"
#include "gradscope/report/contrasts.h"
#include "gradscope/report/format.h"

namespace gradscope {

namespace {

// One contrast's tests against the thresholds' two ends, after Holm's correction.
struct Outcome {
  bool above_low = false, below_low = false, above_high = false, below_high = false;
  ContrastStat low, high;
  double level_low = kNaN, level_high = kNaN;  // the Holm level each p was held to
};

bool two_ended(const ClaimRule& rule) {
  const ClaimComparison c = rule.thresholds.comparison;
  return c == ClaimComparison::kWithin || c == ClaimComparison::kOutside;
}

bool enough_seeds(const ClaimTest& t) {
  return static_cast<int>(t.a.size()) >= kMinSeeds &&
         (!t.b || static_cast<int>(t.b->size()) >= kMinSeeds);
}

ContrastStat stat_of(const ClaimRule& rule, const ClaimTest& t, double threshold) {
  return test_contrast(t.a, t.b, t.seeds_a, t.seeds_b, threshold, rule.thresholds.log_scale);
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

// A distance from the threshold on the rule's scale, in words: a factor on the log scale, an
// amount otherwise.
std::string distance_text(const ClaimRule& rule, double distance) {
  if (rule.thresholds.log_scale) return fmt::format("a factor of {:.3g}", std::exp(distance));
  return fmt::format("{:.3g}", distance);
}

// What a contrast observed: the ratio of a to b (log scale), a - threshold x b, or a's mean.
std::string observed_text(const ClaimRule& rule, const ClaimTest& t, const ContrastStat& s,
                          double threshold) {
  const bool log = rule.thresholds.log_scale;
  if (!t.b) return fmt::format("mean {:.4g}", log ? std::exp(s.effect) * threshold
                                                  : s.effect + threshold);
  if (log) return fmt::format("ratio x{:.3g}", std::exp(s.effect) * threshold);
  if (threshold == 1) return fmt::format("difference {:+.3g}", s.effect);
  return fmt::format("a - {:.4g} b = {:+.3g}", threshold, s.effect);
}

// What an undecided contrast could have detected, and what it would need.
std::string power_text(const ClaimRule& rule, const ContrastStat& s, double threshold,
                       double level) {
  const double mdd = detectable_effect(s, level);
  if (!std::isfinite(mdd)) return "";
  std::string text =
      fmt::format("; could detect {} from {:.4g} ({:.0f}% power at {:.3g})",
                  distance_text(rule, mdd), threshold, 100 * kPower, level);
  if (!(std::abs(s.effect) > 0)) return text + "; no difference observed: no number of seeds";
  const std::optional<int> n = seeds_needed(s, level);
  const std::string observed = distance_text(rule, std::abs(s.effect));
  return text + (n ? fmt::format("; the distance observed, {}, would need {} seeds a side",
                                 observed, *n)
                   : fmt::format("; the distance observed, {}, would need more than {} seeds a "
                                 "side",
                                 observed, kMaxSeedsNeeded));
}

std::string outcome_text(const ClaimRule& rule, const ClaimTest& t, const Outcome& o) {
  const ClaimComparison c = rule.thresholds.comparison;
  if (t.identical) return "the same losses bit for bit in every seed: no change, no test needed";
  const char* kind = o.low.paired ? "paired t" : t.b ? "Welch t" : "one-sample t";
  const char* unit = t.b ? "x" : "";
  std::string p = fmt::format("{}: {} against {:.4g}{}: p = {:.3g} (held to {:.3g})", kind,
                              observed_text(rule, t, o.low, rule.thresholds.low),
                              rule.thresholds.low, unit, o.low.p, o.level_low);
  if (two_ended(rule))
    p += fmt::format("; against {:.4g}{}: p = {:.3g} (held to {:.3g})", rule.thresholds.high,
                     unit, o.high.p, o.level_high);
  if (rule_passes(c, o)) return p + ": passes";
  if (rule_fails(c, o)) return p + ": fails";
  // The end nearer to deciding says what the contrast could have detected.
  // The end that is still open; of two open ends, the one nearer to deciding.
  const bool low_decided = o.above_low || o.below_low;
  const bool high_decided = o.above_high || o.below_high;
  const bool use_high = two_ended(rule) && !high_decided && (low_decided || o.high.p < o.low.p);
  return p + ": undecided" +
         power_text(rule, use_high ? o.high : o.low,
                    use_high ? rule.thresholds.high : rule.thresholds.low,
                    use_high ? o.level_high : o.level_low);
}

// Contrasts of one basis that count, each once: enough seeds, named as deciding, and not the
// same values as an earlier one (a checkpointed cell bit-identical to its standard cell is one
// comparison, not two).
struct Family {
  std::vector<size_t> counted;              // indices into the basis's tests
  std::map<size_t, size_t> duplicate_of;    // test -> the counted test with its values
  int too_few = 0, shown = 0;
};

Family family_of(const std::vector<ClaimTest>& tests) {
  Family f;
  for (size_t i = 0; i < tests.size(); ++i) {
    const ClaimTest& t = tests[i];
    if (!t.decides) {
      ++f.shown;
      continue;
    }
    if (!enough_seeds(t)) {
      ++f.too_few;
      continue;
    }
    // A pair with the same losses bit for bit is its own evidence (no test): never merged.
    const auto same = t.identical ? f.counted.end()
                                  : std::find_if(f.counted.begin(), f.counted.end(), [&](size_t j) {
                                      return !tests[j].identical && tests[j].a == t.a &&
                                             tests[j].b == t.b;
                                    });
    if (same != f.counted.end())
      f.duplicate_of[i] = *same;
    else
      f.counted.push_back(i);
  }
  return f;
}

// The outcomes of a family's contrasts under Holm's correction over every p it tests (both ends
// of a two-ended rule).
std::vector<Outcome> holm_outcomes(const ClaimRule& rule, const std::vector<ClaimTest>& tests,
                                   const Family& f) {
  std::vector<Outcome> out(f.counted.size());
  std::vector<double> ps;
  std::vector<size_t> tested;  // the outcomes whose p values enter the family
  for (size_t k = 0; k < f.counted.size(); ++k) {
    const ClaimTest& t = tests[f.counted[k]];
    if (t.identical) {
      // Nothing changed, bit for bit: below every threshold of a difference, without a test.
      out[k].below_low = out[k].below_high = true;
      out[k].low.p = out[k].high.p = 0;
      continue;
    }
    tested.push_back(k);
    out[k].low = stat_of(rule, t, rule.thresholds.low);
    ps.push_back(out[k].low.valid ? out[k].low.p : 1);
    if (two_ended(rule)) {
      out[k].high = stat_of(rule, t, rule.thresholds.high);
      ps.push_back(out[k].high.valid ? out[k].high.p : 1);
    }
  }
  const std::vector<double> level = holm_levels(ps, kAlpha);
  const size_t per = two_ended(rule) ? 2 : 1;
  for (size_t j = 0; j < tested.size(); ++j) {
    Outcome& o = out[tested[j]];
    o.level_low = level[j * per];
    const bool rejected_low = ps[j * per] < o.level_low;
    o.above_low = rejected_low && o.low.effect > 0;
    o.below_low = rejected_low && o.low.effect < 0;
    if (per == 2) {
      o.level_high = level[j * per + 1];
      const bool rejected_high = ps[j * per + 1] < o.level_high;
      o.above_high = rejected_high && o.high.effect > 0;
      o.below_high = rejected_high && o.high.effect < 0;
    }
  }
  return out;
}

Verdict aggregate(const ClaimRule& rule, const std::vector<Outcome>& outcomes) {
  const ClaimComparison c = rule.thresholds.comparison;
  const int counted = static_cast<int>(outcomes.size());
  int pass = 0, fail = 0, below_high = 0, above_high = 0, above_low = 0, below_low = 0;
  for (const Outcome& o : outcomes) {
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
  return v;
}

// What one basis decided, and the words behind it.
struct BasisDecision {
  Verdict verdict = Verdict::kNotEnoughData;
  std::vector<std::string> contrasts;  // one line per test of the basis
  std::string correction;
  std::string headline;
  std::vector<size_t> deciding_groups;
  int too_few = 0;
};

BasisDecision decide(const ClaimRule& rule, ClaimMeasurement& m, int basis) {
  BasisDecision d;
  if (m.not_comparable) {
    d.verdict = Verdict::kNotComparable;
    return d;
  }
  const std::vector<ClaimTest>& tests = m.tests[basis];
  const Family f = family_of(tests);
  const std::vector<Outcome> outcomes = holm_outcomes(rule, tests, f);
  d.too_few = f.too_few;
  d.verdict = aggregate(rule, outcomes);
  const std::optional<double>& max_peak = rule.thresholds.max_peak_ratio;
  if (d.verdict == Verdict::kReproduced && max_peak && m.peak_ratio > *max_peak)
    d.verdict = Verdict::kNotReproduced;
  // Per test, its line. The headline is the counted contrast with the smallest p among those
  // whose outcome is the verdict's (a pass for reproduced, a fail for not reproduced), or among
  // all when the verdict is neither.
  const ClaimComparison c = rule.thresholds.comparison;
  const auto matches = [&](const Outcome& o) {
    if (d.verdict == Verdict::kReproduced) return rule_passes(c, o);
    if (d.verdict == Verdict::kNotReproduced) return rule_fails(c, o);
    return true;
  };
  double best_p = 2;
  for (size_t i = 0; i < tests.size(); ++i) {
    const ClaimTest& t = tests[i];
    std::string line;
    const auto k = std::find(f.counted.begin(), f.counted.end(), i);
    if (k != f.counted.end()) {
      const Outcome& o = outcomes[k - f.counted.begin()];
      line = outcome_text(rule, t, o);
      for (size_t g : t.groups) d.deciding_groups.push_back(g);
      // The end of a two-ended rule that decided, or the one nearer to deciding.
      const bool decided_low = o.above_low || o.below_low;
      const bool decided_high = o.above_high || o.below_high;
      const bool high = two_ended(rule) && o.high.valid &&
                        (decided_high != decided_low ? decided_high : o.high.p < o.low.p);
      const ContrastStat& end = high ? o.high : o.low;
      const double threshold = high ? rule.thresholds.high : rule.thresholds.low;
      if (t.identical && matches(o) && best_p > 0) {
        best_p = 0;
        d.headline = (t.brief.empty() ? t.name : t.brief) + ": the same losses bit for bit";
      } else if (end.valid && matches(o) && end.p < best_p) {
        best_p = end.p;
        d.headline = fmt::format("{}: {}, p = {:.2g} against {:.4g}{} (held to {:.2g})",
                                 t.brief.empty() ? t.name : t.brief,
                                 observed_text(rule, t, end, threshold), end.p, threshold,
                                 t.b ? "x" : "", high ? o.level_high : o.level_low);
      }
    } else if (f.duplicate_of.count(i)) {
      // Counted once, but its runs are among those the verdict rests on.
      for (size_t g : t.groups) d.deciding_groups.push_back(g);
      line = fmt::format("the same values as \"{}\": counted once",
                         tests[f.duplicate_of.at(i)].name);
    } else if (!t.decides) {
      line = "shown, not one of the contrasts that decide";
    } else {
      line = fmt::format("{} vs {} seed(s): fewer than {}, does not count", t.a.size(),
                         t.b ? t.b->size() : t.a.size(), kMinSeeds);
    }
    if (t.evidence < m.evidence.size()) {
      Evidence& e = m.evidence[t.evidence];
      std::string& text = basis == 0 ? e.steps : basis == 1 ? e.samples : e.evaluations;
      text += (text.empty() ? "" : "; ") + line;
    }
    if (t.decides) d.contrasts.push_back(t.name + ": " + line);
  }
  const size_t identical = std::count_if(f.counted.begin(), f.counted.end(),
                                         [&](size_t i) { return tests[i].identical; });
  const size_t tested = f.counted.size() - identical;
  d.correction = fmt::format(
      "Holm over {} contrast(s) ({} test(s){}) at {:.0f}%{}{}{}", tested,
      tested * (two_ended(rule) ? 2 : 1), two_ended(rule) ? ": both thresholds of each" : "",
      100 * kAlpha,
      identical == 0 ? "" : fmt::format("; {} with the same losses bit for bit, no test needed",
                                        identical),
      f.duplicate_of.empty()
          ? ""
          : fmt::format("; {} with the same values as another counted once",
                        f.duplicate_of.size()),
      f.too_few == 0 ? "" : fmt::format("; {} with fewer than {} seeds a side not counted",
                                        f.too_few, kMinSeeds));
  if (d.headline.empty())
    d.headline = !f.counted.empty() ? "no contrast could be tested"
                 : f.too_few > 0        ? fmt::format("no contrast with {} seeds a side", kMinSeeds)
                                        : "no contrast the rule can test (the notes say why)";
  return d;
}

// Appended to each rule's text: the rule every verdict follows.
std::string seed_rule() {
  return fmt::format(
      " Every contrast is of per-seed values (a diverged run counts as no better than it "
      "began: the larger of its first loss and its loss at the point), needs at least {} "
      "seeds on each side (fewer: listed, not counted) and is tested two-sided: paired by "
      "seed over the seeds both sides ran where they share 3 or more (a seed fixes the "
      "initial weights and, at the same batch, the data order), Welch's t test otherwise; "
      "ratio claims on the log scale. Contrasts with the same values are counted once; the "
      "claim's contrasts are corrected together by Holm's step-down at {:.0f}%. An "
      "undecided contrast states the smallest difference it could have detected ({:.0f}% "
      "power) and the seeds the observed one would need. With no counted contrast, or none "
      "that settles the rule, the verdict is not enough data. Deciding runs shorter than {} "
      "steps, or (for a claim about losses) at rates neither searched (--lr auto) nor fixed "
      "by a recorded choice (--lr-chosen-by), give an indicative verdict only.",
      kMinSeeds, 100 * kAlpha, 100 * kPower, kMinVerdictSteps);
}

// The rule text of the two accumulation claims.
std::string accumulation_rule(const char* model, int factor, int half) {
  return fmt::format(
      "{} runs with accumulation against standard runs of the same settings, paired at the "
      "same micro-batch (the study's setup: k times the effective batch) and at the same "
      "effective batch; the same micro-batch decides where the data has it, at the standard "
      "run's rate (the study's reading; accumulation at a rate tuned for its own step is shown "
      "beside). Per pair, "
      "log(standard loss) - log(accumulation loss) is tested against log {} (half the claimed "
      "{}x): reproduced when more than half the pairs are significantly above, and no "
      "accumulation run needs more than 1.10x the standard run's peak memory (a larger peak "
      "turns a reproduced verdict into not reproduced); not reproduced when more than half are "
      "significantly below.",
      model, half, factor);
}

// The scale of the runs behind the deciding contrasts, and why they cannot carry a verdict.
struct DecidingScale {
  std::string text;
  std::string indicative;  // empty: they can
};

// How much a group's validation loss fell over the last tenth of its steps: per ok run, the
// last evaluation at or before 90% of the steps minus the final one, averaged; nullopt when no
// run has two such evaluations.
std::optional<double> last_tenth_fall(const GroupedRuns& data, const Group& g) {
  std::vector<double> falls;
  for (size_t i : g.ok_runs) {
    const ReportRun& r = data.runs[i];
    if (r.val.size() < 2) continue;
    // The evaluation before the last tenth is an earlier one than the last, which follows it.
    const double end = r.val.back().at.step;
    if (const auto before = val_loss_at(r, Axis::kSteps, 0.9 * end))
      falls.push_back(*before - r.val.back().val_loss);
  }
  if (falls.empty()) return std::nullopt;
  return mean_interval(falls).mean;
}

// rates_matter: the claim is about losses, which depend on the rate (a step time does not).
DecidingScale deciding_scale(const GroupedRuns& data, std::vector<size_t> groups,
                             bool rates_matter) {
  DecidingScale s;
  std::sort(groups.begin(), groups.end());
  groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
  if (groups.empty()) return s;
  int64_t params_lo = -1, params_hi = -1, steps_lo = -1, steps_hi = -1;
  int untuned = 0, judged = 0, falling = 0;
  double largest_fall = 0;
  for (size_t gi : groups) {
    const Group& g = data.groups[gi];
    for (size_t i : g.runs) {
      const auto& p = data.runs[i].record.params;
      if (!p) continue;
      params_lo = params_lo < 0 ? *p : std::min(params_lo, *p);
      params_hi = std::max(params_hi, *p);
    }
    const int64_t steps = g.config.steps;
    steps_lo = steps_lo < 0 ? steps : std::min(steps_lo, steps);
    steps_hi = std::max(steps_hi, steps);
    untuned += !rate_tuned(g.config);
    if (const auto fall = last_tenth_fall(data, g)) {
      ++judged;
      if (*fall > 0) {
        ++falling;
        largest_fall = std::max(largest_fall, *fall);
      }
    }
  }
  const auto range = [](int64_t lo, int64_t hi) {
    return lo == hi ? format_count(lo) : format_count(lo) + "-" + format_count(hi);
  };
  s.text = fmt::format("{} params, {} steps, {} of {} configurations at tuned rates; ",
                       params_lo < 0 ? "unknown" : range(params_lo, params_hi),
                       range(steps_lo, steps_hi), groups.size() - untuned, groups.size());
  s.text += judged == 0 ? "no validation loss to tell whether they had converged"
                        : fmt::format("validation loss still falling at the end in {} of {} "
                                      "(by up to {:.3g} since the evaluation before the last "
                                      "tenth)",
                                      falling, judged, largest_fall);
  std::vector<std::string> why;
  if (untuned > 0 && rates_matter)
    why.push_back(fmt::format("{} of the {} deciding configurations ran at rates neither searched "
                              "nor fixed by a recorded choice",
                              untuned, groups.size()));
  if (steps_lo < kMinVerdictSteps)
    why.push_back(fmt::format("the shortest deciding run has {} steps, under {}", steps_lo,
                              kMinVerdictSteps));
  for (const std::string& w : why) s.indicative += (s.indicative.empty() ? "" : "; ") + w;
  return s;
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
       accumulation_rule("nanovlm", 10, 5) + seed_rule(),
       {Q::kLossRatio, "accumulation", {"nanovlm"}},
       {C::kAtLeast, 5, 0, A::kMedian, 1.10, true}},
      {"accumulation-lm",
       "Gradient accumulation lowers the LM's training loss about 4x, with no extra memory.",
       accumulation_rule("llama", 4, 2) + seed_rule(),
       {Q::kLossRatio, "accumulation", {"llama"}},
       {C::kAtLeast, 2, 0, A::kMedian, 1.10, true}},
      {"adam-not-best",
       "Adam is not the best optimizer everywhere.",
       "The contrasts named in advance, as the study states the claim: Adadelta and SGD against "
       "Adam on the encoder (modernbert) and the decoder (llama), standard step, each other "
       "optimizer's loss against Adam's: reproduced when one is significantly below Adam; not "
       "reproduced when every one is significantly above Adam. Other cells (models, strategies, "
       "optimizers) are shown, not tested. Optimizers spend different compute per step (a line "
       "search evaluates the batch several times), so the fair verdict is at equal gradient "
       "evaluations; equal training time is shown beside it." +
           seed_rule(),
       {Q::kCellsBeatingAdam, "", {}, {"modernbert", "llama"}, {"adadelta", "sgd"}, "standard"},
       {C::kBelow, 1, 0, A::kAny, kNone}},
      {"checkpoint-loss",
       "Gradient checkpointing changes the training loss.",
       "Checkpointed runs against standard runs of the same settings: per seed, |log(checkpointed "
       "loss / standard loss)|, tested against the model's noise floor, the same figure for "
       "runs that compute the same gradient in another order (accumulation at the standard "
       "runs' effective batch against standard, every such pair of the model's optimizers at "
       "the same preset on the same device; ok runs only): "
       "reproduced when some pair is significantly above the noise floor; not reproduced when "
       "every pair is significantly below it (a pair with the same losses bit for bit in every "
       "seed changed nothing and counts as below without a test). Recomputing activations "
       "gives the same gradients (dropout masks redrawn the same), so only floating-point "
       "reordering should show." +
           seed_rule(),
       {Q::kLossDifference, "checkpoint", {}},
       {C::kAtLeast, 1, 0, A::kAny, kNone}},
      {"checkpoint-time",
       "Gradient checkpointing adds up to 60% training time.",
       "Median step times of checkpointed runs against standard runs of the same settings, per "
       "pair tested against the standard's times 1.15 and 1.75 (a quarter of the claim either "
       "way): reproduced when every pair is significantly below 1.75x and some pair "
       "significantly above 1.15x; not reproduced when a pair is significantly above 1.75x or "
       "every pair significantly below 1.15x; on the log scale." +
           seed_rule(),
       {Q::kStepTimeRatio, "checkpoint", {}},
       {C::kWithin, 1.15, 1.75, A::kUpTo, kNone, true}},
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
  BasisDecision d[kBases];
  int too_few = 0;
  for (int b = 0; b < kBases; ++b) {
    d[b] = decide(rule, m, b);
    too_few += d[b].too_few;
  }
  f.verdict = f.leaning = d[0].verdict;
  f.verdict_equal_samples = d[1].verdict;
  f.verdict_equal_evaluations = d[2].verdict;
  f.headline = std::move(d[0].headline);
  f.correction = std::move(d[0].correction);
  f.contrasts = std::move(d[0].contrasts);
  const ClaimQuantity q = rule.measure.quantity;
  const bool about_losses = q == ClaimQuantity::kLossRatio ||
                            q == ClaimQuantity::kCellsBeatingAdam ||
                            q == ClaimQuantity::kLossDifference;
  const DecidingScale scale = deciding_scale(data, d[0].deciding_groups, about_losses);
  f.scale = scale.text;
  if (!scale.indicative.empty()) {
    const auto indicative = [](Verdict& v) {
      if (v == Verdict::kReproduced || v == Verdict::kNotReproduced) v = Verdict::kIndicativeOnly;
    };
    indicative(f.verdict);
    indicative(f.verdict_equal_samples);
    indicative(f.verdict_equal_evaluations);
    m.notes.push_back("Indicative only: " + scale.indicative + ".");
  }
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
