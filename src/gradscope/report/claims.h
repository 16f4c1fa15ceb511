// The claims of "Gradient Under Microscope", re-examined against a database. Each claim is one
// row of a table (study_claims): what the study says, the quantity that tests it, how the
// quantity is compared with the rule's thresholds, and on which models. One evaluator computes
// the quantity from the groups and applies the comparison, at equal steps (the study's basis,
// which decides the verdict) and at equal samples (the fair basis when a strategy changes how
// many samples a step sees).
//
// A verdict is "not enough data" when nothing could be compared, and also when it would turn
// on a difference smaller than the seeds' 95% intervals.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "gradscope/report/groups.h"

namespace gradscope {

enum class Verdict { kReproduced, kNotReproduced, kNotEnoughData };
const char* verdict_name(Verdict v);  // "reproduced", "not reproduced", "not enough data"

// What a claim measures.
enum class ClaimQuantity {
  // The median over (treatment, standard) pairs of the loss ratio standard / treatment; the
  // pairs' largest peak-memory ratio treatment / standard beside it.
  kLossRatio,
  // The cells (model, strategy, settings other than the optimizer's) in which another
  // optimizer's loss is below Adam's by more than their 95% intervals.
  kCellsBeatingAdam,
  // The largest relative loss difference of a (treatment, standard) pair, seed by seed.
  kLossDifference,
  // The largest step-time ratio treatment / standard over the pairs.
  kStepTimeRatio,
  // The median over the model's ok runs of their mean utilization (%).
  kMedianUtilization,
};

// How the quantity is compared with the thresholds.
enum class ClaimComparison {
  kAtLeast,  // quantity >= low
  kAbove,    // quantity > low
  kWithin,   // low <= quantity <= high
};

// What a claim measures, and on what.
struct ClaimMeasure {
  ClaimQuantity quantity;
  std::string treatment;            // the strategy compared with standard ("" when none is)
  std::vector<std::string> models;  // empty: every model in the data
};

// How the measured quantity decides the verdict.
struct ClaimThresholds {
  ClaimComparison comparison;
  double low = 0, high = 0;
  // The threshold a single pair's ratio is held against: when the range its 95% intervals
  // allow holds it, the verdict is too close to call. Unset: no such per-pair test.
  std::optional<double> pair_threshold;
  // Also required: no treatment run needs more than this times its standard run's peak.
  std::optional<double> max_peak_ratio;
};

struct ClaimRule {
  std::string id;     // "accumulation-vlm", ...
  std::string claim;  // the study's claim, in words
  std::string rule;   // how the verdict is decided, in words
  ClaimMeasure measure;
  ClaimThresholds thresholds;
};

// The study's seven claims, in report order.
const std::vector<ClaimRule>& study_claims();

// One compared pair or cell behind a finding, at both bases.
struct Evidence {
  std::string what;     // "nanovlm tiny, adam: accumulation vs standard"
  std::string steps;    // the figure at equal steps, as text
  std::string samples;  // the figure at equal samples, as text
};

struct Finding {
  std::string id;
  std::string claim;
  std::string rule;
  Verdict verdict = Verdict::kNotEnoughData;  // on the study's basis
  Verdict verdict_equal_samples = Verdict::kNotEnoughData;
  std::string measured;  // the headline figure(s) this database gives
  std::vector<Evidence> evidence;
  std::vector<std::string> notes;  // intervals overlapping, device caveats, ...
};

// One claim's finding on these groups.
Finding evaluate_claim(const GroupedRuns& data, const ClaimRule& rule);
// Every claim of study_claims(), in order.
std::vector<Finding> evaluate_claims(const GroupedRuns& data);

}  // namespace gradscope
