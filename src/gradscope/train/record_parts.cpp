#include "gradscope/train/record_parts.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "gradscope/core/env.h"
#include "gradscope/core/statistics.h"
#include "gradscope/measure/peak.h"

namespace gradscope {

RunSensors::RunSensors(const RunConfig& config, const torch::Device& device, MemoryMeter& meter,
                       int threads, const Clock& clock) {
  if (device.is_cuda())
    gpu_sensor_ = open_nvml_sensor(device.has_index() ? device.index() : 0, &gpu_why_not_);
  if (device.is_cpu()) rapl_ = open_rapl(&rapl_why_not_);
  if (config.sample_period_s <= 0) return;
  SamplerSources sources;
  sources.cpu = &cpu_sensor_;
  sources.gpu = gpu_sensor_.get();
  sources.rapl = rapl_.get();
  MemoryMeter* m = &meter;
  sources.allocated_bytes = [m] { return m->current_bytes(); };
  SamplerOptions options;
  options.period_s = config.sample_period_s;
  options.threads = threads;
  options.watts_per_core = config.watts_per_core;
  if (config.grid_g_per_kwh > 0) options.grid_g_per_kwh = config.grid_g_per_kwh;
  sampler_ = std::make_unique<Sampler>(sources, options, clock);
}

namespace {

// GPU utilization from NVML's samples within the timed steps; "not available" (nulls)
// without them, with the reason in `source`.
RunUtilization gpu_utilization(const std::vector<const Sample*>& in_steps,
                               const std::string& why_not) {
  RunUtilization util;
  std::vector<double> gpu;
  for (const Sample* s : in_steps)
    if (s->gpu_util_pct) gpu.push_back(*s->gpu_util_pct);
  util.device = "gpu";
  if (!gpu.empty()) {
    double sum = 0;
    for (double u : gpu) sum += u;
    util.mean_pct = sum / static_cast<double>(gpu.size());
    util.p50_pct = finite_or_null(percentile(gpu, 50));
    util.p95_pct = finite_or_null(percentile(gpu, 95));
  }
  util.samples = static_cast<int64_t>(gpu.size());
  util.source = !gpu.empty() ? std::string("nvml, samples within the timed steps")
                             : "not available (" + why_not + ")";
  return util;
}

// The timed steps' CPU seconds over their wall seconds x threads: evaluation excluded.
RunUtilization cpu_utilization(const RunTally& tally, int threads) {
  RunUtilization util;
  util.device = "cpu";
  double cpu_s = 0;
  for (double c : tally.step_cpus) cpu_s += c;
  if (tally.timed_s > 0) util.mean_pct = 100.0 * cpu_s / (tally.timed_s * threads);
  util.p50_pct = finite_or_null(percentile(tally.step_utils, 50));
  util.p95_pct = finite_or_null(percentile(tally.step_utils, 95));
  util.samples = static_cast<int64_t>(tally.step_utils.size());
  util.source = "process cpu time / (wall x threads), over the timed steps";
  return util;
}

std::optional<double> co2_of(double joules, const RunConfig& config) {
  if (config.grid_g_per_kwh <= 0) return std::nullopt;
  return joules / 3.6e6 * config.grid_g_per_kwh;
}

// The sampler's energy over the timed steps: the source's cumulative reading at each timed
// step's end minus at its start, put into each of `timed` (the timed steps, in order).
RunEnergy sampled_energy(const Sampler& sampler, const RunTally& tally, const RunConfig& config,
                         const std::vector<StepEntry*>& timed) {
  RunEnergy energy = to_energy(sampler.energy());
  if (!energy.joules) return energy;
  double joules = 0;
  size_t measured = 0;
  // The steps before a resume: their energy was taken when the state was saved.
  std::vector<bool> marked(timed.size(), false);
  for (const RunTally::StepMarks& m : tally.step_marks)
    if (m.step < marked.size()) marked[m.step] = true;
  for (size_t i = 0; i < timed.size(); ++i)
    if (!marked[i] && timed[i]->energy_j) {
      joules += *timed[i]->energy_j;
      ++measured;
    }
  for (const RunTally::StepMarks& m : tally.step_marks) {
    const auto step_j = sampler.energy_between(m.from, m.to);
    if (!step_j) continue;
    joules += *step_j;
    ++measured;
    if (m.step < timed.size()) timed[m.step]->energy_j = *step_j;
  }
  const size_t steps = tally.step_times.size();
  energy.joules = measured > 0 ? std::optional<double>(joules) : std::nullopt;
  energy.co2_g = energy.joules ? co2_of(*energy.joules, config) : std::nullopt;
  std::string detail = energy.detail.value_or("");
  detail += fmt::format(
      "; over the {} timed steps only, read at each step's start and end: warm-up and "
      "evaluation excluded",
      steps);
  if (measured < steps)
    detail += fmt::format("; {} of them had no reading at their start or end and are left out",
                          steps - measured);
  energy.detail = detail;
  return energy;
}

// Without the sampler: the timed steps' CPU time x watts per core, labelled an estimate.
RunEnergy estimated_energy(const RunTally& tally, const RunConfig& config, bool on_cpu,
                           const std::vector<StepEntry*>& timed) {
  RunEnergy energy;
  if (on_cpu && !tally.step_cpus.empty()) {
    double joules = 0;
    for (size_t i = 0; i < tally.step_cpus.size(); ++i) {
      const double step_j = tally.step_cpus[i] * config.watts_per_core;
      joules += step_j;
      if (i < timed.size()) timed[i]->energy_j = step_j;
    }
    energy.joules = joules;
    energy.source = "estimate";
    energy.co2_g = co2_of(joules, config);
  }
  energy.detail =
      fmt::format("cpu time of the timed steps x {} W per core (warm-up and evaluation excluded)",
                  config.watts_per_core);
  return energy;
}

}  // namespace

void RunSensors::fill(RunRecord& record, const RunTally& tally, const RunConfig& config,
                      bool on_cpu, int threads) const {
  const std::vector<Sample> samples = sampler_ ? sampler_->samples() : std::vector<Sample>{};
  // A sample covers the interval since the one before it, so the samples of a timed step are
  // those after its start mark up to its end mark.
  std::vector<const Sample*> in_steps;
  for (const RunTally::StepMarks& m : tally.step_marks)
    for (size_t i = m.from + 1; i <= m.to && i < samples.size(); ++i)
      in_steps.push_back(&samples[i]);
  if (on_cpu) {
    record.utilization = cpu_utilization(tally, threads);
  } else {
    std::string why_not = gpu_why_not_;
    if (!sampler_)
      why_not = "the sampler is off (--sample-period 0)";
    else if (gpu_sensor_)
      why_not = "NVML gave no utilization sample within the timed steps";
    record.utilization = gpu_utilization(in_steps, why_not);
  }

  // Each timed step's energy, in the order of the timed steps of record.steps.
  std::vector<StepEntry*> timed;
  for (StepEntry& s : record.steps)
    if (!s.warmup) timed.push_back(&s);
  if (!sampler_) {
    record.timeline = tally.timeline;
    record.energy = estimated_energy(tally, config, on_cpu, timed);
    record.sampler.reset();
    return;
  }
  // The sampler's series, its time counted from the first timed step.
  record.timeline = to_timeline(samples);
  const auto origin = sampler_->origin_s();
  if (origin && tally.timed_wall_start)
    for (auto& s : record.timeline) s.t_s += *origin - *tally.timed_wall_start;
  record.energy = sampled_energy(*sampler_, tally, config, timed);
  record.sampler =
      SamplerInfo{config.sample_period_s, static_cast<int64_t>(record.timeline.size()),
                  sampler_->sampling_seconds(),
                  gpu_sensor_ ? gpu_sensor_->name() : "not available (" + gpu_why_not_ + ")",
                  rapl_ ? rapl_->source() : "not available (" + rapl_why_not_ + ")"};
}

RunTime time_part(const RunTally& tally, double wall_s, bool phase_timing, bool comm) {
  RunTime t;
  const bool any_timed = !tally.step_times.empty();
  if (any_timed) t.total_s = tally.timed_s;
  t.wall_s = wall_s;
  t.step_median_s = finite_or_null(median(tally.step_times));
  if (any_timed && phase_timing) {
    t.data_s = tally.phase_totals[0];
    t.forward_s = tally.phase_totals[1];
    t.backward_s = tally.phase_totals[2];
    t.optimizer_s = tally.phase_totals[3];
    if (comm) t.comm_s = tally.phase_totals[static_cast<int>(Phase::kComm)];
  }
  t.timed_steps = static_cast<int64_t>(tally.step_times.size());
  return t;
}

RunThroughput throughput_part(const RunTally& tally) {
  RunThroughput t;
  if (tally.timed_s > 0) {
    t.samples_per_s = tally.timed_samples / tally.timed_s;
    t.tokens_per_s = tally.timed_tokens / tally.timed_s;
  }
  return t;
}

RunMemory memory_part(const RunTally& tally, const PhaseTimer& timer, const MemoryMeter& meter,
                      int64_t params_bytes, int64_t frozen_params_bytes,
                      std::optional<int64_t> grads_bytes, bool phase_timing,
                      std::optional<int64_t> collective_buffer_bytes) {
  RunMemory m;
  // Training's peak: the phases', and the meter's outside them (between steps, and every
  // step's without phase timing); evaluations reset the meter and are not counted.
  m.peak_bytes = std::max({timer.run_peak(), meter.peak_bytes(), tally.training_peak_bytes});
  // The breakdown is of one moment, the peak's, so its parts sum to the peak: each part is
  // taken out of what is left of it, in this order, and "other" is the rest.
  int64_t left = m.peak_bytes;
  auto take = [&left](int64_t bytes) {
    const int64_t part = std::clamp<int64_t>(bytes, 0, left);
    left -= part;
    return part;
  };
  const std::optional<PeakMoment>& at = timer.peak_moment();
  const bool known = phase_timing && at.has_value();
  // Past every phase's peak: the peak came between the phases (after an update, before the
  // next step's data), when no gradient and no activation of a step is left.
  const bool after_steps = known && m.peak_bytes > at->peak_bytes;
  m.breakdown.params = take(params_bytes);
  m.breakdown.frozen_params = take(frozen_params_bytes);
  if (grads_bytes) {
    // Without phase timing the moment is unknown: every gradient is counted (an upper bound).
    const bool grads_then = !known || (!after_steps && at->grads_exist);
    m.breakdown.grads = take(grads_then ? *grads_bytes : 0);
  }
  const bool state_then = !known || after_steps || at->state_exists;
  m.breakdown.optimizer_state = take(state_then ? tally.state_bytes : 0);
  if (collective_buffer_bytes) {
    const bool buffers_then =
        !known ||
        (!after_steps && (at->phase == Phase::kBackward || at->phase == Phase::kComm));
    m.breakdown.collective_buffers = take(buffers_then ? *collective_buffer_bytes : 0);
  }
  if (known) {
    const bool in_pass = !after_steps && at->forward_start_bytes >= 0;
    m.breakdown.activations = take(in_pass ? at->peak_bytes - at->forward_start_bytes : 0);
    // Of those, the loss head's share: what it keeps for backward, as measured at the end of
    // its forward (in backward the gradient of its logits takes that room), at most the
    // activations themselves. Part of activations, not beside it, so that the parts still sum
    // to the peak and activations means what it meant before the head was measured.
    if (tally.logits_bytes)
      m.breakdown.logits = std::min(*tally.logits_bytes, *m.breakdown.activations);
    m.peak_phase = after_steps ? "between steps" : phase_name(at->phase);
    if (!after_steps) m.peak_step = at->step;
  }
  m.breakdown.other = left;
  m.timeline = tally.memory_timeline;
  m.params_bytes = params_bytes + frozen_params_bytes;
  m.frozen_params_bytes = frozen_params_bytes;
  // Not measured with a fused step: each gradient lives only until its parameter's update.
  m.grads_bytes = grads_bytes;
  m.optimizer_state_bytes = tally.state_bytes;
  m.logits_bytes = tally.logits_bytes;
  // Not measured without phase timing: null, not 0.
  if (phase_timing) {
    m.activations_peak_bytes = timer.activations_peak();
    m.phase_peak_bytes = PhasePeaks{timer.phase_peak(0), timer.phase_peak(1), timer.phase_peak(2),
                                    timer.phase_peak(3), std::nullopt};
    if (collective_buffer_bytes)
      m.phase_peak_bytes->comm = timer.phase_peak(static_cast<int>(Phase::kComm));
  }
  m.reserved_peak_bytes = meter.reserved_peak_bytes();
  const int64_t rss = peak_rss_bytes();  // 0: the system says nothing
  if (rss > 0) m.peak_rss_bytes = rss;
  return m;
}

std::vector<MemoryFigure> memory_figures(const RunRecord& record) {
  std::vector<MemoryFigure> out;
  if (!record.memory) return out;
  const RunMemory& m = *record.memory;
  const auto add = [&](const char* figure, const char* counts, int64_t bytes) {
    out.push_back({figure, counts, bytes, bytes - m.peak_bytes});
  };
  add("peak_bytes", "live tensors (the allocator's bytes in use)", m.peak_bytes);
  if (m.reserved_peak_bytes)
    add("reserved_peak_bytes", "the caching allocator's reserved bytes (live, cached, fragments)",
        *m.reserved_peak_bytes);
  if (m.peak_rss_bytes)
    add("peak_rss_bytes", "the process's resident memory (VmHWM)", *m.peak_rss_bytes);
  std::optional<int64_t> used;
  for (const TimelineSample& s : record.timeline)
    if (s.gpu_memory_used_bytes) used = std::max(used.value_or(0), *s.gpu_memory_used_bytes);
  if (used)
    add("gpu_memory_used_peak_bytes", "the device's used memory as NVML reports it (all processes)",
        *used);
  return out;
}

RankFigures rank_figures_of(const RunRecord& record, int64_t rank,
                            int64_t collective_buffer_peak_bytes, const CommStats& timed,
                            int64_t steps_run, int64_t reduced_bytes, int64_t overlapped_bytes) {
  RankFigures f;
  f.rank = rank;
  if (record.memory) {
    const RunMemory& m = *record.memory;
    f.peak_bytes = m.peak_bytes;
    f.breakdown = m.breakdown;
    f.peak_phase = m.peak_phase;
    f.params_bytes = m.params_bytes;
    f.grads_bytes = m.grads_bytes;
    f.optimizer_state_bytes = m.optimizer_state_bytes;
  }
  f.collective_buffer_peak_bytes = collective_buffer_peak_bytes;
  if (record.time) {
    f.step_median_s = record.time->step_median_s;
    f.comm_s = record.time->comm_s;
    f.backward_s = record.time->backward_s;
  }
  // Over this process's timed steps: the bytes are the same each step.
  if (steps_run > 0) {
    f.bytes_sent_per_step =
        static_cast<double>(timed.bytes_sent) / static_cast<double>(steps_run);
    f.comm_wait_per_step_s = timed.wait_s / static_cast<double>(steps_run);
  }
  if (reduced_bytes > 0)
    f.overlapped_share = static_cast<double>(overlapped_bytes) / static_cast<double>(reduced_bytes);
  return f;
}

RunFlops flops_part(const RunTally& tally, double forward_flops_per_token,
                    double recompute_flops_per_step) {
  RunFlops f;
  f.per_step = 3.0 * forward_flops_per_token * static_cast<double>(tally.tokens_per_step);
  // A step whose optimizer searches along a line evaluates the batch several times.
  if (!tally.step_times.empty() && tally.timed_s > 0)
    f.achieved_per_s = f.per_step * static_cast<double>(tally.timed_evaluations) / tally.timed_s;
  f.formula =
      "3 x analytical forward FLOPs per token x tokens per step (x evaluations per step for "
      "achieved_per_s); hardware adds the sub-layers checkpointing recomputes";
  // Hardware FLOPs count what a checkpoint runs again as well, from the model's blocks and
  // the step plan alone: no estimate of the optimizer's memory is needed.
  f.hardware_per_step = f.per_step + std::max(0.0, recompute_flops_per_step);
  return f;
}

RunEnv env_part(const std::string& device_text, const torch::Device& device) {
  EnvInfo env = current_env(device_text);
  if (device.is_cuda()) env.device_name = reported_device_name(device);
  RunEnv e;
  e.gradscope = env.gradscope_version;
  e.libtorch = env.libtorch;
  if (!env.cuda.empty()) e.cuda = env.cuda;
  e.device_name = env.device_name;
  e.threads = env.threads;
  e.blas_threads = env.blas_threads;
  e.git_commit = env.git_commit;
  e.host = env.host;
  e.build = env.build_type;
  return e;
}

}  // namespace gradscope
