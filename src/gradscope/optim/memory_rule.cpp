#include "gradscope/optim/memory_rule.h"

#include <algorithm>

namespace gradscope {

MemoryRuleInput::MemoryRuleInput(std::vector<ParamExtent> params, const OptSettings& opt,
                                 double weight_decay)
    : params_(std::move(params)), opt_(opt), weight_decay_(weight_decay) {
  for (const ParamExtent& p : params_) {
    total_ += p.bytes;
    largest_ = std::max(largest_, p.bytes);
    if (p.block_matrix) largest_matrix_ = std::max(largest_matrix_, p.bytes);
  }
}

double MemoryRuleInput::setting(const std::string& key, double fallback) const {
  auto it = opt_.find(key);
  if (it == opt_.end()) return fallback;
  if (it->second == "true") return 1;
  if (it->second == "false") return 0;
  try {
    return std::stod(it->second);
  } catch (const std::exception&) {
    return fallback;
  }
}

OptimizerMemory projected_moments_memory(const MemoryRuleInput& in, double rank,
                                         bool keeps_projector) {
  const int64_t f = kOptimizerFloatBytes;
  int64_t state = 0, scratch = 2 * in.largest();
  for (const ParamExtent& s : in.params()) {
    if (!s.block_matrix) {
      state += 2 * s.bytes;
      continue;
    }
    const int64_t lo = std::min(s.rows, s.cols), hi = std::max(s.rows, s.cols);
    const int64_t r = rank >= 1 ? static_cast<int64_t>(rank) : std::max<int64_t>(1, lo / 4);
    state += keeps_projector ? f * (lo * r + 2 * r * hi) : f * (2 * r * hi + 1);
    // The projection, the projected gradient, the moments' update and the full-size update.
    scratch = std::max(scratch, f * (lo * r + 3 * r * hi) + s.bytes);
  }
  return {state, scratch};
}

}  // namespace gradscope
