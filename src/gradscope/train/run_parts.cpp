#include "gradscope/train/run_parts.h"

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

void RunSensors::fill(RunRecord& record, const RunTally& tally, const RunConfig& config,
                      bool on_cpu, int threads, double timed_wall, double timed_cpu) const {
  RunUtilization util;
  if (!on_cpu) {
    // GPU utilization from NVML's samples; "not available" (nulls) without NVML.
    std::vector<double> gpu;
    if (sampler_)
      for (const auto& s : sampler_->samples())
        if (s.gpu_util_pct) gpu.push_back(*s.gpu_util_pct);
    util.device = "gpu";
    if (!gpu.empty()) {
      double sum = 0;
      for (double u : gpu) sum += u;
      util.mean_pct = sum / static_cast<double>(gpu.size());
      util.p50_pct = finite_or_null(percentile(gpu, 50));
      util.p95_pct = finite_or_null(percentile(gpu, 95));
    }
    util.samples = static_cast<int64_t>(gpu.size());
    util.source = !gpu.empty() ? std::string("nvml") : "not available (" + gpu_why_not_ + ")";
  } else {
    util.device = "cpu";
    if (timed_wall > 0) util.mean_pct = 100.0 * timed_cpu / (timed_wall * threads);
    util.p50_pct = finite_or_null(percentile(tally.step_utils, 50));
    util.p95_pct = finite_or_null(percentile(tally.step_utils, 95));
    util.samples = static_cast<int64_t>(tally.step_utils.size());
    util.source = "process cpu time / (wall x threads)";
  }
  record.utilization = util;

  if (sampler_) {
    // The sampler's series, its time counted from the first timed step.
    record.timeline = to_timeline(sampler_->samples());
    const auto origin = sampler_->origin_s();
    if (origin && tally.timed_wall_start > 0)
      for (auto& s : record.timeline) s.t_s += *origin - tally.timed_wall_start;
    record.energy = to_energy(sampler_->energy());
    record.sampler =
        SamplerInfo{config.sample_period_s, static_cast<int64_t>(record.timeline.size()),
                    sampler_->sampling_seconds(),
                    gpu_sensor_ ? gpu_sensor_->name() : "not available (" + gpu_why_not_ + ")",
                    rapl_ ? rapl_->source() : "not available (" + rapl_why_not_ + ")"};
    return;
  }
  record.timeline = tally.timeline;
  // Without the sampler: CPU time x watts per core, labelled an estimate.
  RunEnergy energy;
  if (timed_wall > 0 && on_cpu) {
    const double joules = timed_cpu * config.watts_per_core;
    energy.joules = joules;
    energy.source = "estimate";
    if (config.grid_g_per_kwh > 0) energy.co2_g = joules / 3.6e6 * config.grid_g_per_kwh;
  }
  energy.detail = fmt::format("cpu time x {} W per core", config.watts_per_core);
  record.energy = energy;
  record.sampler.reset();
}

RunTime time_part(const RunTally& tally, double wall_s, bool phase_timing) {
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
                      int64_t params_bytes, std::optional<int64_t> grads_bytes, bool phase_timing) {
  RunMemory m;
  m.peak_bytes = std::max(timer.run_peak(), meter.peak_bytes());
  const int64_t activations = phase_timing ? timer.activations_peak() : 0;
  m.breakdown.params = params_bytes;
  m.breakdown.grads = grads_bytes;
  m.breakdown.optimizer_state = tally.state_bytes;
  if (phase_timing) m.breakdown.activations = activations;
  m.breakdown.other = std::max<int64_t>(
      0, m.peak_bytes - params_bytes - grads_bytes.value_or(0) - tally.state_bytes - activations);
  m.timeline = tally.memory_timeline;
  m.params_bytes = params_bytes;
  // Not measured with a fused step: each gradient lives only until its parameter's update.
  m.grads_bytes = grads_bytes;
  m.optimizer_state_bytes = tally.state_bytes;
  // Not measured without phase timing: null, not 0.
  if (phase_timing) {
    m.activations_peak_bytes = timer.activations_peak();
    m.phase_peak_bytes = PhasePeaks{timer.phase_peak(0), timer.phase_peak(1), timer.phase_peak(2),
                                    timer.phase_peak(3)};
  }
  m.reserved_peak_bytes = meter.reserved_peak_bytes();
  const int64_t rss = peak_rss_bytes();  // 0: the system says nothing
  if (rss > 0) m.peak_rss_bytes = rss;
  return m;
}

RunFlops flops_part(const RunTally& tally, double forward_flops_per_token,
                    const nlohmann::json& estimate) {
  RunFlops f;
  f.per_step = 3.0 * forward_flops_per_token * static_cast<double>(tally.tokens_per_step);
  // A step whose optimizer searches along a line evaluates the batch several times.
  if (!tally.step_times.empty() && tally.timed_s > 0)
    f.achieved_per_s = f.per_step * static_cast<double>(tally.timed_evaluations) / tally.timed_s;
  f.formula =
      "3 x analytical forward FLOPs per token x tokens per step (x evaluations per step for "
      "achieved_per_s)";
  // Hardware FLOPs count the forward a checkpoint recomputes as well (the estimate's ratio).
  const double ratio = estimate.is_object() && estimate.value("model_flops_per_step", 0.0) > 0
                           ? estimate["hardware_flops_per_step"].get<double>() /
                                 estimate["model_flops_per_step"].get<double>()
                           : 1.0;
  f.hardware_per_step = f.per_step * ratio;
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
