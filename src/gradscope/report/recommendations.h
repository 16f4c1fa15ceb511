// Recommendations: per model and memory budget, the optimizer and strategy with the lowest
// validation loss at equal gradient evaluations (groups.h: samples x forward-backward passes,
// so an optimizer with a line search pays for its extra passes) among the configurations that
// fit, and what does not fit. Only a configuration whose every run ended ok, none with a last
// loss above its first (a blow-up without a NaN), is ranked; the others are named with why.
// Each configuration's validation loss at that point is its last evaluation at or before it.
// A ranked configuration with none there (it never evaluated, or not that early: a line
// search spends its evaluations in few steps) is left out and named, with its training loss
// at the point beside the chosen one's. Only when no ranked configuration has a validation
// loss there does the row rank by training loss, and say so.
//
// The lowest mean over seeds is not always a real lead: the row also lists the ranked
// configurations whose per-seed losses at the point are not significantly above the chosen
// one's (Welch's t test, two-sided, Holm's step-down at 95% over the comparisons, each side
// with at least kMinSeeds seeds; with fewer, nothing can be told apart and every one is
// listed).
//
// Budgets are the memory caps runs ran under, those asked for, and, when there is neither,
// the data's own range: the leanest configuration's peak, the median one's, and no limit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gradscope/report/groups.h"

namespace gradscope {

struct Recommendation {
  std::string model;
  double budget_bytes = 0;     // 0: no limit
  std::string budget_source;   // "a memory cap in the data", "--memory-budget", ...
  std::optional<size_t> best;  // group index
  Interval best_loss;          // at equal evaluations
  std::string loss_kind;       // "validation" or "training": what the row ranks by
  std::string loss_note;       // why training loss, and which fitting groups were not ranked
  std::vector<std::string> loss_notes;  // the same, one note per entry (loss_note joins them)
  // Fitting groups ranked beside the best whose losses are not significantly above its own.
  std::vector<size_t> not_worse;
  double equal_evaluations = 0;
  double equal_samples = 0;  // the best group's samples at equal_evaluations
  // The best group's time and energy to equal_evaluations.
  double time_to_point_s = 0, energy_to_point_j = 0;
  bool energy_known = false;
  std::vector<size_t> fits, misses;  // group indices
  std::vector<std::string> miss_reasons;
};

// One recommendation per model and budget, models in order, budgets ascending (0, no limit,
// first). `memory_budgets` are the budgets asked for, in bytes.
std::vector<Recommendation> recommend(const GroupedRuns& data,
                                      const std::vector<int64_t>& memory_budgets);

}  // namespace gradscope
