// The parts of a run record the trainer assembles once training ends: what the loop tallied,
// turned into time, throughput, memory, utilization, energy, FLOPs and the environment, each
// as docs/metrics.md defines it. Kept apart from the loop so the loop stays the loop.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "gradscope/comm/comm.h"
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
  std::vector<double> step_cpus;   // process CPU seconds of the timed steps
  // With the sampler: the indices of its samples (Sampler::mark) at a timed step's start and
  // end, so that energy and utilization cover the timed steps alone; `step` counts the timed
  // steps from 0 (a step whose mark failed has none).
  struct StepMarks {
    size_t step = 0, from = 0, to = 0;
  };
  std::vector<StepMarks> step_marks;
  std::array<double, PhaseTimer::kPhases> phase_totals{};
  double timed_s = 0, timed_samples = 0, timed_tokens = 0;
  int64_t timed_evaluations = 0;
  int64_t tokens_per_step = 0;  // of the first step
  std::vector<StepMemory> memory_timeline;
  std::vector<TimelineSample> timeline;  // without the sampler: one entry per timed step
  // The clock at the first timed step (earlier by the timed seconds before a resume); nullopt
  // until timed steps began. Any value, below zero too: a clock may start anywhere.
  std::optional<double> timed_wall_start;
  int64_t state_bytes = 0;  // optimizer state after the first step
  // The allocator's peak up to the last evaluation (evaluation excluded).
  int64_t training_peak_bytes = 0;
  // What the loss head left allocated when its forward ended, the most over the timed
  // micro-batches (Model::loss_options().head_probe); null without a language-model head.
  std::optional<int64_t> logits_bytes;
};

// The sampler thread and its sensors: utilization, memory, power and energy over the timed
// steps (none when --sample-period is 0).
class RunSensors {
 public:
  RunSensors(const RunConfig& config, const torch::Device& device, MemoryMeter& meter, int threads,
             const Clock& clock);
  Sampler* sampler() { return sampler_.get(); }
  // The record's timeline, energy, sampler and utilization parts, and each timed step's
  // energy_j (record.steps must hold tally.steps). Energy and utilization cover the timed
  // steps alone: neither warm-up nor evaluation. The timeline holds every sample, its time
  // counted from the first timed step.
  void fill(RunRecord& record, const RunTally& tally, const RunConfig& config, bool on_cpu,
            int threads) const;

 private:
  ProcCpuSensor cpu_sensor_;
  std::unique_ptr<GpuSensor> gpu_sensor_;
  std::string gpu_why_not_ = "not a GPU run";
  std::unique_ptr<EnergyCounter> rapl_;
  std::string rapl_why_not_;
  std::unique_ptr<Sampler> sampler_;
};

// comm: the run has a communication phase (--shard), summed into comm_s.
RunTime time_part(const RunTally& tally, double wall_s, bool phase_timing, bool comm = false);
RunThroughput throughput_part(const RunTally& tally);
// The peak by component, as allocated at the moment of the peak (the timer's peak_moment):
// parameters that train, and frozen ones (LoRA's base); gradients, if the step had made them by
// then; optimizer state, if an update had made it; activations, what the micro-batch's forward and
// backward had added above the bytes at the forward's start; "other", the rest (the data set, the
// batch, temporaries of the update, caches). The parts sum to peak_bytes. Without phase timing the
// moment is unknown: every gradient and the state are counted and activations are null.
// With --shard, collective_buffer_bytes (the most the collectives held at once) is a part of
// its own when the peak fell in backward or communication, and the communication phase has a
// peak of its own.
// The record's memory figures side by side (RunMemory::figures) from its memory part and,
// on CUDA, the largest device memory NVML reported in its timeline.
std::vector<MemoryFigure> memory_figures(const RunRecord& record);

RunMemory memory_part(const RunTally& tally, const PhaseTimer& timer, const MemoryMeter& meter,
                      int64_t params_bytes, int64_t frozen_params_bytes,
                      std::optional<int64_t> grads_bytes, bool phase_timing,
                      std::optional<int64_t> collective_buffer_bytes = std::nullopt);
// This rank's own figures of a run with several ranks, from its record's parts; `timed` is
// what the collectives of the steps_run timed steps of this process did (evaluation's and the
// loop's own agreement on stopping left out).
RankFigures rank_figures_of(const RunRecord& record, int64_t rank,
                            int64_t collective_buffer_peak_bytes, const CommStats& timed,
                            int64_t steps_run, int64_t reduced_bytes, int64_t overlapped_bytes);
// Model FLOPs (3 x the analytical forward x tokens per step), achieved FLOP/s and hardware
// FLOPs (model FLOPs + what checkpointing recomputes per step, estimate.h recompute_flops);
// peaks, MFU and HFU come from apply_device_peak.
RunFlops flops_part(const RunTally& tally, double forward_flops_per_token,
                    double recompute_flops_per_step);
RunEnv env_part(const std::string& device_text, const torch::Device& device);

}  // namespace gradscope
