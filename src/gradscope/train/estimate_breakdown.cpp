// The estimate as the record and the report read it (train/estimate.h): its JSON, and its peak
// split as the memory timeline splits live bytes.
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

nlohmann::json estimate_to_json(const MemoryEstimate& e) {
  nlohmann::json j = {{"peak_bytes", e.peak_bytes},
                      {"peak_phase", e.peak_phase},
                      {"params_bytes", e.params_bytes},
                      {"frozen_params_bytes", e.frozen_params_bytes},
                      {"grads_bytes", e.grads_bytes},
                      {"optimizer_state_bytes", e.optimizer_state_bytes},
                      {"optimizer_scratch_bytes", e.optimizer_scratch_bytes},
                      {"activations_bytes", e.activations_bytes},
                      {"logits_bytes", e.logits_bytes},
                      {"batch_bytes", e.batch_bytes},
                      {"data_bytes", e.data_bytes},
                      {"phase_peak_bytes",
                       {{"forward", e.forward_peak_bytes},
                        {"backward", e.backward_peak_bytes},
                        {"optimizer", e.optimizer_peak_bytes},
                        {"eval", e.eval_peak_bytes}}},
                      {"collective_buffers_bytes", e.collective_buffers_bytes},
                      {"model_flops_per_step", e.model_flops_per_step},
                      {"hardware_flops_per_step", e.hardware_flops_per_step},
                      {"recompute_flops_per_step", e.recompute_flops_per_step},
                      {"recompute_flops_by_tower", e.recompute_flops_by_tower},
                      {"notes", e.notes}};
  if (e.comm_peak_bytes > 0) j["phase_peak_bytes"]["communication"] = e.comm_peak_bytes;
  if (e.sharded)
    j["per_rank"] = {{"nproc", e.nproc},
                     {"shard", e.shard},
                     {"flat_params", e.flat_elements},
                     {"shard_params", e.shard_elements}};
  return j;
}

}  // namespace gradscope
