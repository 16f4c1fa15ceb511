// The parts of a run record the trainer assembles once training ends: what the loop tallied,
// turned into time, throughput, memory, utilization, energy, FLOPs and the environment, each
// as docs/metrics.md defines it. Kept apart from the loop so the loop stays the loop.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "gradscope/core/record.h"
#include "gradscope/measure/clock.h"
#include "gradscope/measure/memory.h"
#include "gradscope/measure/sampler.h"
#include "gradscope/measure/sensors.h"
#include "gradscope/train/phase_timer.h"

namespace gradscope {

// What the training loop tallies step by step.
struct RunTally {
  std::vector<StepEntry> steps;
  std::vector<EvalEntry> evals;
  std::vector<double> step_times;  // time_s of the timed steps
  std::vector<double> step_utils;  // CPU utilization of the timed steps, in %
  std::array<double, PhaseTimer::kPhases> phase_totals{};
  double timed_s = 0, timed_samples = 0, timed_tokens = 0;
  int64_t timed_evaluations = 0;
  int64_t tokens_per_step = 0;  // of the first step
  std::vector<StepMemory> memory_timeline;
  std::vector<TimelineSample> timeline;  // without the sampler: one entry per timed step
  double timed_cpu_start = 0, timed_wall_start = 0;  // at the first timed step
  int64_t state_bytes = 0;                           // optimizer state after the first step
};

// The sampler thread and its sensors: utilization, memory, power and energy over the timed
// steps (none when --sample-period is 0).
class RunSensors {
 public:
  RunSensors(const RunConfig& config, const torch::Device& device, MemoryMeter& meter, int threads,
             const Clock& clock);
  Sampler* sampler() { return sampler_.get(); }
  // The record's timeline, energy, sampler and utilization parts; `timed_wall_start` is the
  // clock at the first timed step (the timeline counts from it), `timed_wall` and `timed_cpu`
  // the wall and process CPU seconds since.
  void fill(RunRecord& record, const RunTally& tally, const RunConfig& config, bool on_cpu,
            int threads, double timed_wall, double timed_cpu) const;

 private:
  ProcCpuSensor cpu_sensor_;
  std::unique_ptr<GpuSensor> gpu_sensor_;
  std::string gpu_why_not_ = "not a GPU run";
  std::unique_ptr<EnergyCounter> rapl_;
  std::string rapl_why_not_;
  std::unique_ptr<Sampler> sampler_;
};

RunTime time_part(const RunTally& tally, double wall_s, bool phase_timing);
RunThroughput throughput_part(const RunTally& tally);
// The peak by component: what is left after parameters, gradients, optimizer state and
// activations is "other" (the data set, the batch, temporaries of the update, caches).
RunMemory memory_part(const RunTally& tally, const PhaseTimer& timer, const MemoryMeter& meter,
                      int64_t params_bytes, std::optional<int64_t> grads_bytes, bool phase_timing);
// Model FLOPs (3 x the analytical forward x tokens per step), achieved FLOP/s and hardware
// FLOPs (the estimate's recompute ratio); peaks and MFU come from apply_device_peak.
RunFlops flops_part(const RunTally& tally, double forward_flops_per_token,
                    const nlohmann::json& estimate);
RunEnv env_part(const std::string& device_text, const torch::Device& device);

}  // namespace gradscope
