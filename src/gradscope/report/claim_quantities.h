// The comparisons behind the study's claims (ClaimQuantity in claims.h), gathered from the
// groups as per-seed values, with the evidence, headline and notes the report shows beside
// each verdict. The verdict itself is the evaluator's (claims.cpp): it tests each contrast
// against the rule's thresholds (contrasts.h), corrects them together and combines the
// outcomes.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "gradscope/report/claims.h"

namespace gradscope {

// One comparison (a contrast): per-seed values a against per-seed values b (scaled by a
// threshold), or against the thresholds themselves when b is nullopt.
struct ClaimTest {
  std::vector<double> a;
  std::optional<std::vector<double>> b;
  // The seed of each value; sides with the same seeds are tested paired (contrasts.h). Empty:
  // unpaired.
  std::vector<uint64_t> seeds_a, seeds_b;
  size_t evidence = 0;  // the Evidence row it belongs to; the evaluator adds its outcome there
  std::string name;     // the contrast in words: "llama tiny, standard: sgd vs adam"
  std::string brief;    // the same in a few words, for a headline: "llama sgd vs adam"
  // Whether it is one of the contrasts the claim names as deciding it; the others are shown
  // with their figures but are not tested.
  bool decides = true;
  std::vector<size_t> groups;  // the groups behind its two sides (their scale is stated)
  // The two runs of every seed ended with the same loss bit for bit: nothing changed, which
  // needs no test (kLossDifference: the contrast fails outright).
  bool identical = false;
};

struct ClaimMeasurement {
  std::vector<ClaimTest> tests[kBases];  // per basis (claims.h)
  double peak_ratio = 0;  // the largest treatment / standard peak of the deciding pairs
  // The data measured something else than the study: the verdict is "not comparable here".
  bool not_comparable = false;
  std::string measured;
  std::vector<Evidence> evidence;
  std::vector<std::string> notes;

  // For quantities that do not depend on the basis (step time, utilization).
  void same_at_every_basis() {
    for (int b = 1; b < kBases; ++b) tests[b] = tests[0];
  }
};

ClaimMeasurement measure_claim(const GroupedRuns& data, const ClaimRule& rule);

// Its rate was tuned: searched (--lr auto) or fixed by a recorded choice (--lr-chosen-by).
bool rate_tuned(const RunConfig& c);

}  // namespace gradscope
