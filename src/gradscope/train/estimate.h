// `gradscope estimate`: a run's peak memory and FLOPs predicted without training, from a model
// of the computation (models/common/memory_trace.h): parameters, gradients and optimizer state
// from the architecture and the optimizer's update rule; activations by replaying what the
// step's forward allocates and autograd saves, under the run's strategy.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gradscope/core/config.h"

namespace gradscope {

struct MemoryEstimate {
  int64_t params_bytes = 0;
  int64_t grads_bytes = 0;
  int64_t optimizer_state_bytes = 0;
  int64_t optimizer_scratch_bytes = 0;  // temporaries of the update, largest parameter's
  int64_t activations_bytes = 0;        // saved for backward when one micro-batch's forward ends
  int64_t batch_bytes = 0;              // the batch and the model's cached tables
  int64_t data_bytes = 0;               // the data set held in memory (measured when loaded)
  // Peaks of the phases, in bytes, everything included.
  int64_t forward_peak_bytes = 0;
  int64_t backward_peak_bytes = 0;
  int64_t optimizer_peak_bytes = 0;
  int64_t eval_peak_bytes = 0;
  int64_t peak_bytes = 0;
  std::string peak_phase;
  // Analytical FLOPs per optimizer step: the model's (3 x forward) and the hardware's (with
  // the forward a checkpoint recomputes).
  double model_flops_per_step = 0;
  double hardware_flops_per_step = 0;
  std::vector<std::string> notes;
};

// The estimate for a run. `data_bytes`: what its data set holds in memory on the device (0
// when it is elsewhere, e.g. on the host of a GPU run). Throws a usage error for a model,
// optimizer or strategy it has no model of.
MemoryEstimate estimate_run(const RunConfig& config, int64_t data_bytes);

nlohmann::json estimate_to_json(const MemoryEstimate& e);

// The largest micro-batch whose estimated peak fits `budget_bytes` (0 when even 1 does not).
int64_t max_batch_within(RunConfig config, int64_t data_bytes, int64_t budget_bytes);

}  // namespace gradscope

namespace gradscope {

// Bytes the run's data set keeps in CPU memory once loaded, measured with the tracking
// allocator around loading it (0 when the run is not on the CPU, where the device's memory
// does not hold it). Loading errors propagate as usage errors.
int64_t resident_data_bytes(const RunConfig& config);

}  // namespace gradscope
