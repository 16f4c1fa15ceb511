// Recommendations: per model and memory budget, the optimizer and strategy with the lowest
// training loss at equal samples among the configurations that fit, and what does not fit.
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
  Interval best_loss;          // at equal samples
  double equal_samples = 0;
  double time_to_samples_s = 0, energy_to_samples_j = 0;  // the best group's, to equal_samples
  bool energy_known = false;
  std::vector<size_t> fits, misses;  // group indices
  std::vector<std::string> miss_reasons;
};

// One recommendation per model and budget, models in order, budgets ascending (0, no limit,
// first). `memory_budgets` are the budgets asked for, in bytes.
std::vector<Recommendation> recommend(const GroupedRuns& data,
                                      const std::vector<int64_t>& memory_budgets);

}  // namespace gradscope
