// The estimate's peak split as the memory timeline splits live bytes (train/estimate.h).
#include <algorithm>

#include "gradscope/core/memory_timeline.h"
#include "gradscope/train/estimate.h"

namespace gradscope {

std::map<std::string, int64_t> estimate_breakdown_at_peak(const MemoryEstimate& e) {
  const std::string& phase = e.peak_phase;
  const bool after_forward = phase != "forward";
  std::map<std::string, int64_t> parts;
  parts[component_name(MemoryComponent::kParameters)] = e.params_bytes;
  parts[component_name(MemoryComponent::kOptimizerState)] = e.optimizer_state_bytes;
  parts[component_name(MemoryComponent::kGradients)] =
      phase == "backward" ? e.grads_at_backward_peak_bytes : after_forward ? e.grads_bytes : 0;
  parts[component_name(MemoryComponent::kCollectiveBuffers)] =
      e.sharded && after_forward ? e.collective_buffers_bytes : 0;
  parts[component_name(MemoryComponent::kOther)] =
      e.batch_bytes + e.data_bytes + (phase == "optimizer" ? e.optimizer_scratch_bytes : 0);
  int64_t named = 0;
  for (const auto& [name, bytes] : parts) named += bytes;
  const int64_t rest = std::max<int64_t>(e.peak_bytes - named, 0);
  const int64_t logits = std::min(e.logits_bytes, rest);
  parts[component_name(MemoryComponent::kLogits)] = logits;
  parts[component_name(MemoryComponent::kActivations)] = rest - logits;
  return parts;
}

}  // namespace gradscope
