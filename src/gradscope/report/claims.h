// The claims of "Gradient Under Microscope", re-examined against a database. Each claim is one
// row of a table (study_claims): what the study says, what it compares, how each comparison is
// held against the rule's thresholds, and how the comparisons make a verdict. One evaluator
// decides them all, at equal steps (the study's basis, the headline verdict), at equal samples
// (the fair basis when a strategy changes how many samples a step sees) and at equal gradient
// evaluations (the fair basis for compute: a line search spends several passes per step).
//
// The one rule of every verdict: a claim is decided by the contrasts it names (a comparison of
// per-seed values: a loss at the basis's point, a step time, a utilization), each needing at
// least kMinSeeds seeds on each side and tested two-sided against the rule's thresholds
// (contrasts.h: paired by seed where both sides ran the same seeds, ratio claims on the log
// scale); contrasts with the same values count once, and the claim's contrasts are held at
// kAlpha together by Holm's step-down. A contrast with fewer seeds is listed but does not
// count; one the test cannot decide either way is undecided and says what it could have
// detected. The verdict is "not enough data" when no contrast counts or the counted ones do not
// settle the rule, and "indicative only" when the deciding runs cannot carry one.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "gradscope/report/groups.h"

namespace gradscope {

// kNotComparable: the data measures something else than the study did (a CPU's utilization
// against the study's GPU utilization). kIndicativeOnly: the rule was applied to runs that
// cannot carry a verdict (untuned learning rates, or too few steps); Finding::leaning says
// which way it pointed.
enum class Verdict {
  kReproduced,
  kNotReproduced,
  kNotEnoughData,
  kNotComparable,
  kIndicativeOnly
};
// "reproduced", "not reproduced", "not enough data", "not comparable here", "indicative only"
const char* verdict_name(Verdict v);

// Seeds a side of a comparison needs before it counts toward a verdict.
inline constexpr int kMinSeeds = 3;
// The two-sided level at which a claim's contrasts, together, decide its verdict.
inline constexpr double kAlpha = 0.05;
// Deciding runs shorter than this give an indicative verdict only: a convention, stated with
// every rule, against verdicts from a few dozen steps (the demo's).
inline constexpr int64_t kMinVerdictSteps = 100;

// What a claim compares.
enum class ClaimQuantity {
  // Per (treatment, standard) pair: the standard run's loss against the treatment's scaled by
  // the threshold (standard / treatment >= low); the pairs' largest peak-memory ratio beside.
  kLossRatio,
  // Per cell (model, strategy, settings other than the optimizer's) and optimizer other than
  // Adam: its loss against Adam's (another optimizer below Adam).
  kCellsBeatingAdam,
  // Per (treatment, standard) pair: the treatment's loss against the standard's scaled by
  // the band's ends (a relative difference beyond the band).
  kLossDifference,
  // Per (treatment, standard) pair: the treatment's step time against the standard's scaled.
  kStepTimeRatio,
  // Per configuration of the model, on GPU runs only: the runs' mean utilization (%) against
  // the range's ends as constants.
  kMedianUtilization,
};

// How one comparison (a against b, or against a constant) is held against the thresholds;
// "above low" means a is significantly above low x b.
enum class ClaimComparison {
  kAtLeast,  // passes when above low, fails when below low
  kBelow,    // passes when below low, fails when above low
  kWithin,   // passes when above low and below high, fails when below low or above high
  kOutside,  // passes when below low or above high, fails when above low and below high
};

// How the counted comparisons make the verdict.
enum class ClaimAggregate {
  kMedian,  // reproduced when more than half pass, not reproduced when more than half fail
  kAny,     // reproduced when one passes, not reproduced when every one fails
  // For kWithin: reproduced when every one is below high and one above low; not reproduced
  // when one is above high or every one below low.
  kUpTo,
};

// What a claim measures, and on what.
struct ClaimMeasure {
  ClaimQuantity quantity;
  std::string treatment;            // the strategy compared with standard ("" when none is)
  std::vector<std::string> models;  // empty: every model in the data
  // The contrasts named in advance as deciding the claim (kCellsBeatingAdam): these models,
  // optimizers against Adam, with this strategy; empty: every one decides. The others are
  // shown, not tested.
  std::vector<std::string> contrast_models{}, contrast_optimizers{};
  std::string contrast_strategy{};
};

// How the comparisons decide the verdict.
struct ClaimThresholds {
  ClaimComparison comparison;
  double low = 0, high = 0;
  ClaimAggregate aggregate = ClaimAggregate::kMedian;
  // Also required: no treatment run needs more than this times its standard run's peak.
  std::optional<double> max_peak_ratio;
  // A ratio claim: tested as log a - log b against log low (log high), so that a seed weighs
  // as a factor (contrasts.h).
  bool log_scale = false;
};

struct ClaimRule {
  std::string id;     // "accumulation-vlm", ...
  std::string claim;  // the study's claim, in words
  std::string rule;   // how the verdict is decided, in words (the seed rule included)
  ClaimMeasure measure;
  ClaimThresholds thresholds;
};

// The study's seven claims, in report order.
const std::vector<ClaimRule>& study_claims();

// The bases of a verdict, in order: equal steps (the study's), equal samples, equal gradient
// evaluations.
inline constexpr int kBases = 3;
Axis basis_axis(int basis);

// One compared pair or cell behind a finding, at each basis.
struct Evidence {
  std::string what;         // "nanovlm tiny, adam: accumulation vs standard"
  std::string steps;        // the figure at equal steps, as text
  std::string samples;      // at equal samples
  std::string evaluations;  // at equal gradient evaluations
  std::string time;         // at equal training time, shown beside (no verdict); "" if none
};

struct Finding {
  std::string id;
  std::string claim;
  std::string rule;
  Verdict verdict = Verdict::kNotEnoughData;  // on the study's basis
  Verdict verdict_equal_samples = Verdict::kNotEnoughData;
  Verdict verdict_equal_evaluations = Verdict::kNotEnoughData;
  // What the rule gave on the study's basis when the verdict is kIndicativeOnly (otherwise the
  // verdict itself).
  Verdict leaning = Verdict::kNotEnoughData;
  std::string measured;  // the headline figure(s) this database gives
  // One short line: the contrast behind the verdict on the study's basis, its figure, p and the
  // level it was held to ("llama sgd vs adam: difference -0.14, p = 0.003 against 1x (held to
  // 0.0125)").
  std::string headline;
  // The scale of the deciding runs: parameters, steps, how their rates were chosen, whether
  // their validation loss was still falling over the last tenth of the run.
  std::string scale;
  // The correction the contrasts were tested under, and what was counted once.
  std::string correction;
  // Each deciding contrast on the study's basis, named, with its test, p, the level it was
  // held to, its outcome and, when undecided, the smallest difference it could have detected
  // and the seeds it would need.
  std::vector<std::string> contrasts;
  std::vector<Evidence> evidence;
  std::vector<std::string> notes;  // seeds too few, device caveats, ...
};

// One claim's finding on these groups.
Finding evaluate_claim(const GroupedRuns& data, const ClaimRule& rule);
// Every claim of study_claims(), in order.
std::vector<Finding> evaluate_claims(const GroupedRuns& data);

}  // namespace gradscope
