// The quantities of the study's claims (ClaimQuantity in claims.h), computed from the groups,
// with the evidence, headline and notes the report shows beside each verdict. The verdict
// itself is the evaluator's (claims.cpp): it compares the value with the rule's thresholds.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "gradscope/report/claims.h"

namespace gradscope {

// A claim's quantity per basis: index 0 at equal steps (the study's), 1 at equal samples.
struct ClaimMeasurement {
  std::optional<double> value[2];  // nullopt: nothing could be compared
  // The verdict would turn on a difference smaller than the 95% intervals.
  bool too_close[2] = {false, false};
  double peak_ratio = 0;  // the largest treatment / standard peak of the deciding pairs
  std::string measured;
  std::vector<Evidence> evidence;
  std::vector<std::string> notes;

  // For quantities that do not depend on the basis (step time, utilization).
  void same_at_both_bases() {
    value[1] = value[0];
    too_close[1] = too_close[0];
  }
};

ClaimMeasurement measure_claim(const GroupedRuns& data, const ClaimRule& rule);

}  // namespace gradscope
