// What would have fitted a run that ran out of memory under a cap, by the estimate
// (train/estimate.h): the largest micro-batch under the run's other settings, and every memory
// method gradscope has, tried one at a time on top of the run's settings, with its estimated
// peak and whether it fits.
//
// Each method is a configuration built from the run's own settings and checked as the session
// checks a run (the settings, the step plan, the loss head, LoRA, the fused step and its folds,
// sharding): combinations gradscope refuses are not tried. Its flags are what a user appends to
// the run's command line (a repeated flag takes its last value), read off the settings table.
//
// Cheapest first, by what a method costs the training, in four tiers:
//   1. keeps the math and the compute: the chunked loss, accumulation over micro-batches of the
//      same effective batch, the optimizer step in backward (no gradient buffer; the fused
//      step, or accumulation folded into SGD's momentum);
//   2. recomputes: a checkpoint policy, by the forward FLOPs it runs again per step (the
//      estimate's recompute_flops_per_step), fewest first;
//   3. changes what is trained or its precision: 8-bit optimizer state (adam8bit), Adam's
//      micro-batches folded into its moments (AdamA, another update rule), LoRA adapters;
//   4. needs more devices: zero1, zero2, fsdp over 2, 4 and 8 ranks, the same global batch,
//      fewest ranks first, then the mode that communicates least.
// The cheapest that fits is the first of them whose estimated peak is within the cap.
#pragma once

#include <cstdint>

#include "gradscope/core/config.h"
#include "gradscope/core/record.h"
#include "gradscope/measure/memory.h"
#include "gradscope/train/session.h"

namespace gradscope {

// The fit of `run` (the configuration as given) within `cap_bytes`, with `data_bytes` held by
// its data set on the device. A usage error when the estimate has no model of the run itself.
MemoryFit fit_within(const RunConfig& run, int64_t data_bytes, int64_t cap_bytes);

// The record's view of the tracking allocator's refusal: the request and its label, the live
// bytes and the cap, the kFailureLiveLabels largest labels live then (the rest summed) and the
// live bytes summed by component, largest first.
FailureMemory refusal_memory(const MemoryRefusal& refusal);

// What memory looked like when the run of `session` ran out of it: the tracking allocator's
// refusal (CPU), the caching allocator's reserved peak (CUDA, read from `meter`), and with a
// cap what the estimate says would have fitted it (none when the estimate has no model of it).
FailureMemory oom_memory(const Session& session, const MemoryMeter& meter);

// `run` with `flags` applied as the command line would apply them (the settings table's
// parsers; a repeated flag takes its last value). A usage error for an unknown flag.
RunConfig with_flags(RunConfig run, const std::vector<std::string>& flags);

}  // namespace gradscope
