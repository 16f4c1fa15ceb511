// A background thread that samples the sensors (sensors.h) every period while a run trains:
// CPU utilization and RSS of this process, allocated bytes, the GPU's utilization, memory,
// power and clock, and energy. The samples make the record's timeline; their energy makes
// the record's energy, measured where a counter exists and labelled an estimate where not.
//
// Energy, in order of preference:
//   "nvml"        the GPU's own cumulative energy counter (Volta and newer): the whole GPU,
//                 every process on it, nothing outside it;
//   "nvml-power"  the GPU's power samples integrated over time (trapezoids), for GPUs without
//                 the counter: misses peaks shorter than the period;
//   "rapl"        the CPU packages' counters: the whole package, every process on the machine;
//   "estimate"    this process's CPU seconds x SamplerOptions::watts_per_core.
// A source counts when it read at least twice; one that read over the whole run (first to
// last sample) is "full", one that read only over part of it is "partial" and its joules
// cover that part, which the detail says. The first source in the order above that counts is
// used, except that a partial GPU counter gives way to full GPU power integration (same
// device, whole run). Carbon: co2_g = joules / 3.6e6 (J per kWh) x grid intensity in g/kWh.
#pragma once

#include <array>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gradscope/core/record.h"
#include "gradscope/measure/clock.h"
#include "gradscope/measure/sensors.h"

namespace gradscope {

// Energy from reads of a cumulative counter: the sum of the increases between consecutive
// readings, which is the counter's last value minus its first plus its wraps, however coarse
// its steps. A reading that fails (nullopt) is counted as missing and bridged: the counter
// kept counting, so the next good reading's increase covers the gap. A reading below the
// previous one means the counter wrapped (the increase is reading + wrap - previous, right
// while at most one wrap happens between readings); with no known wrap it means the counter
// was reset (e.g. the driver reloaded): that interval adds nothing and the reading becomes the
// new base, so later increases still count.
class CounterIntegrator {
 public:
  explicit CounterIntegrator(std::optional<double> wrap_j = std::nullopt) : wrap_j_(wrap_j) {}
  void add(std::optional<double> reading_j);
  double total_j() const { return total_j_; }
  int readings() const { return readings_; }  // good ones
  int missing() const { return missing_; }
  int wraps() const { return wraps_; }
  int resets() const { return resets_; }  // decreases with no known wrap

 private:
  std::optional<double> wrap_j_;
  std::optional<double> last_j_;
  double total_j_ = 0.0;
  int readings_ = 0, missing_ = 0, wraps_ = 0, resets_ = 0;
};

// Energy from power samples (t_s, watts), for a GPU without an energy counter: trapezoids
// between consecutive good samples. A missing sample (nullopt) is bridged by the trapezoid
// between its neighbours; samples whose time does not advance add nothing.
class PowerIntegrator {
 public:
  void add(double t_s, std::optional<double> power_w);
  double total_j() const { return total_j_; }
  int readings() const { return readings_; }
  int missing() const { return missing_; }

 private:
  std::optional<double> last_t_s_, last_w_;
  double total_j_ = 0.0;
  int readings_ = 0, missing_ = 0;
};

// One sample. Every measurement is nullopt where it could not be read (JSON null, never 0).
struct Sample {
  double t_s = 0.0;                        // seconds since the first sample
  std::optional<int64_t> allocated_bytes;  // SamplerSources::allocated_bytes()
  // 100 x process CPU seconds / (seconds x threads) since the previous sample; none at the first.
  std::optional<double> cpu_util_pct;
  std::optional<int64_t> rss_bytes;
  std::optional<double> gpu_util_pct;
  std::optional<int64_t> gpu_memory_used_bytes;
  std::optional<double> power_w;       // GPU board power
  std::optional<double> sm_clock_mhz;  // GPU SM clock
  // Joules since the energy source's first reading, from the source energy() uses (as it
  // stands when samples() is called); nullopt where that source did not read.
  std::optional<double> energy_j;
  bool gpu_sensor = false;  // a GPU sensor was attached: the timeline's util_pct is the GPU's
};

struct SamplerOptions {
  // Seconds between samples. Shorter resolves utilization better but costs more (see
  // sampling_seconds()); NVML's own utilization window is 1/6 s to 1 s, /proc counts CPU time
  // in 10 ms ticks.
  double period_s = 0.1;
  // The threads the run was given (--threads): the denominator of CPU utilization.
  int threads = 1;
  // Watts per busy core for the estimate when nothing measures energy: a round figure between
  // server cores (about 5-8 W of TDP each) and desktop cores (about 10-15 W). Only the CPU
  // time of this process is counted: memory, disks, fans and idle cores are not.
  double watts_per_core = 10.0;
  // Carbon intensity of the electricity in g CO2 per kWh (e.g. ~400 world average); none
  // means co2_g is null.
  std::optional<double> grid_g_per_kwh;
};

// The sensors a sampler reads. Each pointer may be null (that part is then not sampled) and
// must outlive the sampler. allocated_bytes is called on the sampler's thread while the run
// trains on its own, so it must be thread-safe (CpuMemoryTracker's counters are atomics;
// CUDA's allocator statistics take the allocator's lock). The GPU's name(), and RAPL's
// source() and wrap_j(), are read once, when the sampler is made.
struct SamplerSources {
  CpuSensor* cpu = nullptr;
  GpuSensor* gpu = nullptr;
  EnergyCounter* rapl = nullptr;
  std::function<int64_t()> allocated_bytes;
};

struct EnergyResult {
  std::optional<double> joules;
  std::string source;  // "nvml" | "nvml-power" | "rapl" | "estimate" | "" when unknown
  std::optional<double> co2_g;
  std::string detail;  // what was measured and how, and what is missing
};

class Sampler {
 public:
  // Throws a usage error on a bad option. Time stamps come from `clock` (which must outlive
  // the sampler and be safe to read from another thread while start() runs: SteadyClock is,
  // FakeClock is meant for sample_now() alone); the thread's own schedule uses the steady
  // clock, so that a fake clock cannot stall it.
  Sampler(SamplerSources sources, SamplerOptions options, const Clock& clock);
  ~Sampler();
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  // Takes a first sample at once, on the caller's thread, then one every period on a
  // background thread. Samples one run: later calls do nothing.
  void start();
  // Stops and joins the thread (promptly: it waits on a condition variable, not a sleep),
  // then takes a last sample, so the samples span start() to stop(). Does nothing when start()
  // was not called or stop() already ran. Never throws; an exception the thread met is kept
  // in thread_error().
  void stop();
  // Takes one sample on the caller's thread (tests drive a sampler this way, with a
  // FakeClock and no thread). Safe alongside the thread: samples are taken one at a time.
  void sample_now();
  // Takes one sample on the caller's thread, as sample_now(), and returns its index in
  // samples(): the trainer marks the start and the end of each timed step with it, so that
  // energy and utilization can be read over the steps alone.
  size_t mark();

  std::vector<Sample> samples() const;  // a copy, safe while the thread runs
  EnergyResult energy() const;          // over the first to the last sample
  // Joules between samples `from` and `to` (indices from mark()), by the source energy()
  // uses: its cumulative reading at `to` minus that at `from`. nullopt where that source did
  // not read at either sample, or no source counts.
  std::optional<double> energy_between(size_t from, size_t to) const;
  // Wall seconds spent reading the sensors, the sampler's own cost to the run.
  double sampling_seconds() const;
  // Clock::now_s() at the first sample (Sample::t_s counts from it); nullopt before it.
  std::optional<double> origin_s() const;
  // What stopped the thread early (an exception from a sensor or allocated_bytes); empty if
  // nothing did.
  std::string thread_error() const;

 private:
  enum EnergySource {
    kEnergySourceNvml,
    kEnergySourceNvmlPower,
    kEnergySourceRapl,
    kEnergySourceEstimate,
    kEnergySourceCount,
  };
  // One energy source over the run.
  struct Track {
    std::vector<std::optional<double>> cumulative_j;  // per sample
    std::optional<double> first_t_s, last_t_s;        // its first and last good reading
    int readings = 0;
  };
  void run_thread();
  // The source energy() uses, or kEnergySourceCount when none can; mutex_ held.
  int chosen_source() const;

  SamplerSources sources_;
  SamplerOptions options_;
  const Clock& clock_;
  // Read once here, so that energy() never calls a sensor while the thread reads it.
  std::string gpu_name_, rapl_source_;

  std::mutex sample_mutex_;   // one sample at a time (thread, sample_now, stop)
  mutable std::mutex mutex_;  // guards samples_ to thread_error_
  std::vector<Sample> samples_;
  std::optional<double> origin_s_;
  std::optional<double> last_cpu_s_, last_cpu_t_s_;  // the last good CPU reading
  CounterIntegrator gpu_counter_;
  PowerIntegrator gpu_power_;
  CounterIntegrator rapl_counter_;
  CounterIntegrator cpu_counter_;  // process CPU seconds (x watts_per_core: the estimate)
  std::array<Track, kEnergySourceCount> tracks_;
  double sampling_seconds_ = 0.0;
  std::string thread_error_;

  std::mutex wake_mutex_;
  std::condition_variable wake_;
  bool stop_requested_ = false;  // guarded by wake_mutex_
  bool started_ = false, stopped_ = false;
  std::thread thread_;
};

// The record's timeline: the samples, with util_pct the GPU's when a GPU sensor was attached,
// else the CPU's. Unknown values stay unknown (null in the record), never 0.
std::vector<TimelineSample> to_timeline(const std::vector<Sample>& samples);
// The record's energy part; an empty source or detail is unknown.
RunEnergy to_energy(const EnergyResult& energy);

}  // namespace gradscope
