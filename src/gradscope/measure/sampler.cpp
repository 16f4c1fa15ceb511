#include "gradscope/measure/sampler.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <exception>

#include "gradscope/core/error.h"

namespace gradscope {

void CounterIntegrator::add(std::optional<double> reading_j) {
  if (!reading_j) {
    ++missing_;
    return;
  }
  ++readings_;
  if (last_j_) {
    double delta_j = *reading_j - *last_j_;
    if (delta_j < 0) {
      if (wrap_j_) {
        delta_j += *wrap_j_;
        ++wraps_;
      } else {
        delta_j = 0;
        ++resets_;
      }
    }
    total_j_ += delta_j;
  }
  last_j_ = reading_j;
}

void PowerIntegrator::add(double t_s, std::optional<double> power_w) {
  if (!power_w) {
    ++missing_;
    return;
  }
  ++readings_;
  if (last_t_s_ && t_s > *last_t_s_) total_j_ += 0.5 * (*power_w + *last_w_) * (t_s - *last_t_s_);
  if (!last_t_s_ || t_s > *last_t_s_) {
    last_t_s_ = t_s;
    last_w_ = power_w;
  }
}

namespace {

const char* const kSourceNames[] = {"nvml", "nvml-power", "rapl", "estimate"};

}  // namespace

Sampler::Sampler(SamplerSources sources, SamplerOptions options, const Clock& clock)
    : sources_(std::move(sources)),
      options_(options),
      clock_(clock),
      gpu_name_(sources_.gpu ? sources_.gpu->name() : ""),
      rapl_source_(sources_.rapl ? sources_.rapl->source() : ""),
      rapl_counter_(sources_.rapl ? sources_.rapl->wrap_j() : std::nullopt) {
  check_usage(std::isfinite(options_.period_s) && options_.period_s > 0,
              fmt::format("sampling period {} s must be > 0", options_.period_s));
  check_usage(options_.threads >= 1, fmt::format("threads {} must be >= 1", options_.threads));
  check_usage(std::isfinite(options_.watts_per_core) && options_.watts_per_core >= 0,
              fmt::format("watts per core {} must be >= 0", options_.watts_per_core));
  check_usage(!options_.grid_g_per_kwh ||
                  (std::isfinite(*options_.grid_g_per_kwh) && *options_.grid_g_per_kwh >= 0),
              fmt::format("grid carbon intensity {} g/kWh must be >= 0",
                          options_.grid_g_per_kwh.value_or(0)),
              "world average is about 400 g/kWh; see your grid operator for yours");
}

Sampler::~Sampler() { stop(); }

void Sampler::start() {
  if (started_) return;
  started_ = true;
  sample_now();
  thread_ = std::thread(&Sampler::run_thread, this);
}

void Sampler::stop() {
  if (!started_ || stopped_) return;
  stopped_ = true;
  {
    std::lock_guard<std::mutex> lock(wake_mutex_);
    stop_requested_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  try {
    sample_now();
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (thread_error_.empty()) thread_error_ = e.what();
  }
}

void Sampler::run_thread() {
  using std::chrono::steady_clock;
  const auto period = std::chrono::duration_cast<steady_clock::duration>(
      std::chrono::duration<double>(options_.period_s));
  // Deadlines on a fixed grid, so the samples do not drift later by the cost of each read.
  auto next = steady_clock::now() + period;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(wake_mutex_);
      if (wake_.wait_until(lock, next, [this] { return stop_requested_; })) return;
    }
    try {
      sample_now();
    } catch (const std::exception& e) {
      // An exception leaving a thread would end the process; the run keeps going unsampled.
      std::lock_guard<std::mutex> lock(mutex_);
      thread_error_ = e.what();
      return;
    }
    next += period;
    // Fell behind (a slow read, a busy machine): skip the missed slots rather than burst.
    const auto now = steady_clock::now();
    if (next < now) next = now + period;
  }
}

void Sampler::sample_now() { mark(); }

size_t Sampler::mark() {
  std::lock_guard<std::mutex> one_at_a_time(sample_mutex_);
  // The sensors are read outside mutex_, so samples() and energy() never wait for a slow
  // driver call.
  const auto read_start = std::chrono::steady_clock::now();
  const double now_s = clock_.now_s();
  std::optional<CpuReading> cpu;
  if (sources_.cpu) cpu = sources_.cpu->read();
  std::optional<GpuReading> gpu;
  if (sources_.gpu) gpu = sources_.gpu->read();
  std::optional<double> rapl_j;
  if (sources_.rapl) rapl_j = sources_.rapl->read_j();
  std::optional<int64_t> allocated;
  if (sources_.allocated_bytes) allocated = sources_.allocated_bytes();
  const double read_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - read_start).count();

  std::lock_guard<std::mutex> lock(mutex_);
  sampling_seconds_ += read_s;
  if (!origin_s_) origin_s_ = now_s;
  Sample s;
  s.t_s = now_s - *origin_s_;
  s.allocated_bytes = allocated;
  s.gpu_sensor = sources_.gpu != nullptr;
  if (cpu) {
    // Against the last good reading: after a failed one the utilization is the mean over the
    // gap, still a true figure.
    if (last_cpu_s_ && now_s > *last_cpu_t_s_)
      s.cpu_util_pct = 100.0 * (cpu->cpu_s - *last_cpu_s_) /
                       ((now_s - *last_cpu_t_s_) * static_cast<double>(options_.threads));
    last_cpu_s_ = cpu->cpu_s;
    last_cpu_t_s_ = now_s;
    s.rss_bytes = cpu->rss_bytes;
  }
  if (gpu) {
    s.gpu_util_pct = gpu->util_pct;
    s.gpu_memory_used_bytes = gpu->memory_used_bytes;
    s.power_w = gpu->power_w;
    s.sm_clock_mhz = gpu->sm_clock_mhz;
  }
  samples_.push_back(s);

  auto record = [&](EnergySource source, bool good, double cumulative_j) {
    Track& track = tracks_[source];
    track.cumulative_j.push_back(good ? std::optional<double>(cumulative_j) : std::nullopt);
    if (!good) return;
    if (!track.first_t_s) track.first_t_s = s.t_s;
    track.last_t_s = s.t_s;
    ++track.readings;
  };
  const std::optional<double> gpu_energy_j = gpu ? gpu->energy_j : std::nullopt;
  const std::optional<double> gpu_power_w = gpu ? gpu->power_w : std::nullopt;
  if (sources_.gpu) gpu_counter_.add(gpu_energy_j);
  record(kEnergySourceNvml, gpu_energy_j.has_value(), gpu_counter_.total_j());
  if (sources_.gpu) gpu_power_.add(s.t_s, gpu_power_w);
  record(kEnergySourceNvmlPower, gpu_power_w.has_value(), gpu_power_.total_j());
  if (sources_.rapl) rapl_counter_.add(rapl_j);
  record(kEnergySourceRapl, rapl_j.has_value(), rapl_counter_.total_j());
  if (sources_.cpu) cpu_counter_.add(cpu ? std::optional<double>(cpu->cpu_s) : std::nullopt);
  record(kEnergySourceEstimate, cpu.has_value(), cpu_counter_.total_j() * options_.watts_per_core);
  return samples_.size() - 1;
}

int Sampler::chosen_source() const {
  if (samples_.size() < 2) return kEnergySourceCount;
  const double first_s = samples_.front().t_s, last_s = samples_.back().t_s;
  auto counts = [&](int source) { return tracks_[source].readings >= 2; };
  auto full = [&](int source) {
    return counts(source) && tracks_[source].first_t_s == first_s &&
           tracks_[source].last_t_s == last_s;
  };
  for (int source = 0; source < kEnergySourceCount; ++source) {
    if (!counts(source)) continue;
    if (source == kEnergySourceNvml && !full(source) && full(kEnergySourceNvmlPower))
      return kEnergySourceNvmlPower;
    return source;
  }
  return kEnergySourceCount;
}

std::vector<Sample> Sampler::samples() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Sample> copy = samples_;
  const int source = chosen_source();
  for (size_t i = 0; i < copy.size(); ++i)
    copy[i].energy_j = source < kEnergySourceCount ? tracks_[source].cumulative_j[i] : std::nullopt;
  return copy;
}

EnergyResult Sampler::energy() const {
  std::lock_guard<std::mutex> lock(mutex_);
  EnergyResult result;
  if (samples_.size() < 2) {
    result.detail = "fewer than two samples: no interval to measure";
    return result;
  }
  const int source = chosen_source();
  if (source == kEnergySourceCount) {
    result.detail =
        fmt::format("nothing measured energy: {}; {}; {}",
                    sources_.gpu ? "the GPU reported neither energy nor power" : "no GPU sensor",
                    sources_.rapl ? "RAPL could not be read" : "no RAPL counter",
                    sources_.cpu ? "process CPU time could not be read" : "no CPU sensor");
    return result;
  }

  const CounterIntegrator* counter = nullptr;
  int missing = 0;
  std::string detail;
  switch (source) {
    case kEnergySourceNvml:
      counter = &gpu_counter_;
      result.joules = gpu_counter_.total_j();
      detail = fmt::format(
          "NVML energy counter of {}: the whole GPU, every process on it; CPU and host not "
          "included",
          gpu_name_);
      break;
    case kEnergySourceNvmlPower:
      result.joules = gpu_power_.total_j();
      missing = gpu_power_.missing();
      detail = fmt::format(
          "NVML power of {} sampled every {} s and integrated (trapezoids), since {}: the "
          "whole GPU, every process on it; peaks shorter than the period are missed; CPU and "
          "host not included",
          gpu_name_, options_.period_s,
          tracks_[kEnergySourceNvml].readings > 0 ? "its energy counter read only part of the run"
                                                  : "it reports no energy counter");
      break;
    case kEnergySourceRapl:
      counter = &rapl_counter_;
      result.joules = rapl_counter_.total_j();
      detail = fmt::format(
          "{}: whole CPU packages, every process on the machine, not this "
          "process alone{}",
          rapl_source_,
          sources_.gpu ? "; GPU not included (it reported neither energy nor "
                         "power)"
                       : "");
      break;
    default:
      counter = &cpu_counter_;
      result.joules = cpu_counter_.total_j() * options_.watts_per_core;
      detail = fmt::format(
          "estimate: process CPU time {:.3f} s x {} W per core (not measured); memory, GPU and "
          "the rest of the machine not included",
          cpu_counter_.total_j(), options_.watts_per_core);
      break;
  }
  if (counter) {
    missing = counter->missing();
    if (counter->wraps() > 0)
      detail += fmt::format("; the counter wrapped {} time(s)", counter->wraps());
    if (counter->resets() > 0)
      detail += fmt::format("; the counter went back {} times (reset): those intervals add nothing",
                            counter->resets());
  }
  const Track& track = tracks_[source];
  const double run_s = samples_.back().t_s;
  if (track.first_t_s != samples_.front().t_s || track.last_t_s != samples_.back().t_s) {
    detail += fmt::format(
        "; read only from t={:.3f} s to t={:.3f} s of a {:.3f} s run: the joules cover that "
        "part only",
        *track.first_t_s, *track.last_t_s, run_s);
  } else if (missing > 0) {
    detail += fmt::format("; {} of {} readings failed and were bridged", missing,
                          static_cast<int>(samples_.size()));
  }
  result.source = kSourceNames[source];
  result.detail = detail;
  if (options_.grid_g_per_kwh) result.co2_g = *result.joules / 3.6e6 * *options_.grid_g_per_kwh;
  return result;
}

std::optional<double> Sampler::energy_between(size_t from, size_t to) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const int source = chosen_source();
  if (source == kEnergySourceCount || from > to || to >= samples_.size()) return std::nullopt;
  const auto& cumulative = tracks_[source].cumulative_j;
  if (!cumulative[from] || !cumulative[to]) return std::nullopt;
  return *cumulative[to] - *cumulative[from];
}

double Sampler::sampling_seconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sampling_seconds_;
}

std::optional<double> Sampler::origin_s() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return origin_s_;
}

std::string Sampler::thread_error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return thread_error_;
}

std::vector<TimelineSample> to_timeline(const std::vector<Sample>& samples) {
  std::vector<TimelineSample> out;
  out.reserve(samples.size());
  for (const Sample& s : samples) {
    TimelineSample t;
    t.t_s = s.t_s;
    t.allocated_bytes = s.allocated_bytes;
    t.cpu_util_pct = s.cpu_util_pct;
    t.rss_bytes = s.rss_bytes;
    t.gpu_util_pct = s.gpu_util_pct;
    t.gpu_memory_used_bytes = s.gpu_memory_used_bytes;
    t.power_w = s.power_w;
    t.sm_clock_mhz = s.sm_clock_mhz;
    t.energy_j = s.energy_j;
    t.util_pct = s.gpu_sensor ? s.gpu_util_pct : s.cpu_util_pct;
    out.push_back(t);
  }
  return out;
}

RunEnergy to_energy(const EnergyResult& energy) {
  RunEnergy e;
  e.joules = energy.joules;
  if (!energy.source.empty()) e.source = energy.source;
  e.co2_g = energy.co2_g;
  if (!energy.detail.empty()) e.detail = energy.detail;
  return e;
}

}  // namespace gradscope
