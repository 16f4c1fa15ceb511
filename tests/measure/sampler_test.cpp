#include "gradscope/measure/sampler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "gradscope/core/error.h"
#include "gradscope/core/record.h"

namespace gradscope {
namespace {

// Sensors that report whatever the test last set.
struct FakeCpuSensor final : CpuSensor {
  std::optional<CpuReading> now;
  std::optional<CpuReading> read() override { return now; }
  void set(double cpu_s, int64_t rss_bytes = 1000) { now = CpuReading{cpu_s, 4, rss_bytes}; }
};

struct FakeGpuSensor final : GpuSensor {
  GpuReading now;
  GpuReading read() override { return now; }
  std::string name() const override { return "Fake GPU"; }
};

struct FakeCounter final : EnergyCounter {
  std::optional<double> now;
  std::optional<double> wrap;
  std::optional<double> read_j() override { return now; }
  std::optional<double> wrap_j() const override { return wrap; }
  std::string source() const override { return "fake RAPL"; }
};

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// ---------------------------------------------------------------------------------------
// Integrators

TEST(CounterIntegrator, SumsIncreasesAndUnwraps) {
  CounterIntegrator c(100.0);
  for (double r : {90.0, 95.0, 5.0, 20.0}) c.add(r);  // 5 + (5 + 100 - 95) + 15
  EXPECT_DOUBLE_EQ(c.total_j(), 30.0);
  EXPECT_EQ(c.wraps(), 1);
  EXPECT_EQ(c.readings(), 4);
}

TEST(CounterIntegrator, CoarseCounterGivesItsEndsDifference) {
  // A counter that moves only now and then must still give last - first.
  CounterIntegrator c;
  for (double r : {100.0, 100.0, 100.0, 150.0, 150.0, 150.0, 150.0, 212.5}) c.add(r);
  EXPECT_DOUBLE_EQ(c.total_j(), 112.5);
}

TEST(CounterIntegrator, DecreaseWithoutWrapIsAResetNotANegative) {
  CounterIntegrator c;
  for (double r : {10.0, 20.0, 5.0, 8.0}) c.add(r);  // 10, then a reset, then 3 from the new base
  EXPECT_DOUBLE_EQ(c.total_j(), 13.0);
  EXPECT_EQ(c.resets(), 1);
  EXPECT_EQ(c.wraps(), 0);
}

TEST(CounterIntegrator, MissingReadingsAreBridged) {
  CounterIntegrator c;
  c.add(std::nullopt);  // nothing to start from yet
  c.add(10.0);
  c.add(std::nullopt);
  c.add(30.0);  // the counter kept counting through the gap
  EXPECT_DOUBLE_EQ(c.total_j(), 20.0);
  EXPECT_EQ(c.missing(), 2);
  EXPECT_EQ(c.readings(), 2);
}

TEST(PowerIntegrator, TrapezoidsOnKnownCurves) {
  // Linear power: trapezoids are exact. P(t) = 100 + 50 t over [0, 4] s: 400 + 25 x 16 J.
  PowerIntegrator linear;
  for (int t = 0; t <= 4; ++t) linear.add(t, 100.0 + 50.0 * t);
  EXPECT_DOUBLE_EQ(linear.total_j(), 800.0);

  // P(t) = t^2 sampled at 0, 1, 2: trapezoids give (0+1)/2 + (1+4)/2 = 3 (the integral is 8/3).
  PowerIntegrator square;
  for (int t = 0; t <= 2; ++t) square.add(t, 1.0 * t * t);
  EXPECT_DOUBLE_EQ(square.total_j(), 3.0);

  // A missing sample is bridged by its neighbours; a repeated time adds nothing.
  PowerIntegrator gaps;
  gaps.add(0.0, 100.0);
  gaps.add(1.0, std::nullopt);
  gaps.add(2.0, 100.0);
  gaps.add(2.0, 500.0);
  EXPECT_DOUBLE_EQ(gaps.total_j(), 200.0);
  EXPECT_EQ(gaps.missing(), 1);
}

// ---------------------------------------------------------------------------------------
// Sampler driven by hand

TEST(SamplerCpu, UtilizationIsCpuTimeOverWallTimesThreads) {
  FakeClock clock(1000.0);
  FakeCpuSensor cpu;
  SamplerOptions options;
  options.threads = 2;
  Sampler sampler({&cpu, nullptr, nullptr, {}}, options, clock);
  cpu.set(1.0, 4096);
  sampler.sample_now();
  clock.advance(0.5);
  cpu.set(1.5);  // 0.5 s of CPU in 0.5 s on 2 threads
  sampler.sample_now();
  clock.advance(1.0);
  cpu.set(3.5);  // 2 s in 1 s on 2 threads
  sampler.sample_now();
  clock.advance(1.0);
  cpu.now.reset();  // unreadable
  sampler.sample_now();
  clock.advance(1.0);
  cpu.set(4.5);  // 1 s over the 2 s since the last good reading
  sampler.sample_now();

  const auto s = sampler.samples();
  ASSERT_EQ(s.size(), 5u);
  EXPECT_DOUBLE_EQ(s[0].t_s, 0.0);
  EXPECT_DOUBLE_EQ(s[2].t_s, 1.5);
  EXPECT_EQ(sampler.origin_s(), 1000.0);
  EXPECT_FALSE(s[0].cpu_util_pct.has_value());  // nothing to compare with yet
  EXPECT_EQ(s[0].rss_bytes, 4096);
  ASSERT_TRUE(s[1].cpu_util_pct && s[2].cpu_util_pct && s[4].cpu_util_pct);
  EXPECT_DOUBLE_EQ(*s[1].cpu_util_pct, 50.0);
  EXPECT_DOUBLE_EQ(*s[2].cpu_util_pct, 100.0);
  EXPECT_FALSE(s[3].cpu_util_pct.has_value());
  EXPECT_FALSE(s[3].rss_bytes.has_value());
  EXPECT_DOUBLE_EQ(*s[4].cpu_util_pct, 25.0);
}

// The trainer marks each timed step's start and end; energy_between reads the chosen
// source's cumulative joules at the two marks, so what falls between steps (evaluation) is
// not counted in any step.
TEST(SamplerMarks, EnergyBetweenMarksExcludesWhatLiesOutside) {
  FakeClock clock;
  FakeCounter rapl;
  Sampler sampler({nullptr, nullptr, &rapl, {}}, SamplerOptions{}, clock);
  rapl.now = 100.0;
  const size_t step1_start = sampler.mark();
  clock.advance(0.1);
  rapl.now = 150.0;
  sampler.sample_now();  // the thread's sample, inside the step
  clock.advance(0.1);
  rapl.now = 170.0;
  const size_t step1_end = sampler.mark();
  clock.advance(1.0);
  rapl.now = 400.0;  // an evaluation between the steps
  sampler.sample_now();
  const size_t step2_start = sampler.mark();
  clock.advance(0.1);
  rapl.now = 410.0;
  const size_t step2_end = sampler.mark();
  EXPECT_EQ(step1_start, 0u);
  EXPECT_EQ(step1_end, 2u);
  EXPECT_EQ(step2_start, 4u);
  EXPECT_EQ(step2_end, 5u);
  EXPECT_EQ(sampler.samples().size(), 6u);
  EXPECT_DOUBLE_EQ(*sampler.energy_between(step1_start, step1_end), 70.0);
  EXPECT_DOUBLE_EQ(*sampler.energy_between(step2_start, step2_end), 10.0);
  EXPECT_DOUBLE_EQ(*sampler.energy().joules, 310.0);  // the whole sampled span
  // A mark whose reading failed gives no figure rather than a wrong one.
  rapl.now.reset();
  const size_t unread = sampler.mark();
  EXPECT_FALSE(sampler.energy_between(step2_start, unread).has_value());
  EXPECT_FALSE(sampler.energy_between(step2_end, step2_start).has_value());
}

// The samples and the energy as the run record writes them.
nlohmann::json timeline_json(const std::vector<Sample>& samples) {
  RunRecord record;
  record.timeline = to_timeline(samples);
  return record_to_json(record)["timeline"];
}
nlohmann::json energy_json(const EnergyResult& energy) {
  RunRecord record;
  record.energy = to_energy(energy);
  return record_to_json(record)["energy"];
}

TEST(SamplerJson, NullsStayNull) {
  FakeClock clock;
  FakeCpuSensor cpu;
  FakeGpuSensor gpu;
  Sampler sampler({&cpu, &gpu, nullptr, [] { return int64_t{0}; }}, {}, clock);
  gpu.now.memory_used_bytes = 0;    // a real 0 stays 0
  gpu.now.util_pct = std::nullopt;  // e.g. a MIG instance
  cpu.set(1.0);
  sampler.sample_now();
  clock.advance(1.0);
  cpu.set(1.5);
  sampler.sample_now();

  const nlohmann::json j = timeline_json(sampler.samples());
  ASSERT_EQ(j.size(), 2u);
  for (const char* key :
       {"t_s", "allocated_bytes", "cpu_util_pct", "rss_bytes", "gpu_util_pct",
        "gpu_memory_used_bytes", "power_w", "sm_clock_mhz", "energy_j", "util_pct"})
    EXPECT_TRUE(j[1].contains(key)) << key;
  EXPECT_EQ(j[1]["allocated_bytes"], 0);
  EXPECT_EQ(j[1]["gpu_memory_used_bytes"], 0);
  EXPECT_DOUBLE_EQ(j[1]["cpu_util_pct"].get<double>(), 50.0);
  EXPECT_TRUE(j[1]["gpu_util_pct"].is_null());
  // With a GPU the timeline's utilization is the GPU's, unknown here: not the CPU's figure.
  EXPECT_TRUE(j[1]["util_pct"].is_null());
  EXPECT_TRUE(j[1]["power_w"].is_null());
  EXPECT_TRUE(j[1]["sm_clock_mhz"].is_null());
  EXPECT_TRUE(j[0]["cpu_util_pct"].is_null());

  // Without a GPU sensor util_pct is the CPU's; with no allocated_bytes callback, null.
  Sampler cpu_only({&cpu, nullptr, nullptr, {}}, {}, clock);
  cpu_only.sample_now();
  clock.advance(2.0);
  cpu.set(2.5);
  cpu_only.sample_now();
  const nlohmann::json k = timeline_json(cpu_only.samples());
  EXPECT_DOUBLE_EQ(k[1]["util_pct"].get<double>(), 50.0);
  EXPECT_TRUE(k[1]["allocated_bytes"].is_null());
  EXPECT_TRUE(k[1]["gpu_memory_used_bytes"].is_null());
}

TEST(SamplerEnergy, GpuCounterFirst) {
  FakeClock clock;
  FakeCpuSensor cpu;
  FakeGpuSensor gpu;
  FakeCounter rapl;
  Sampler sampler({&cpu, &gpu, &rapl, {}}, {}, clock);
  // A coarse counter: flat, then a jump; power and RAPL also read, and must not be used.
  int i = 0;
  for (double e : {5000.0, 5000.0, 5000.0, 5120.0, 5120.0, 5300.0}) {
    gpu.now.energy_j = e;
    gpu.now.power_w = 999.0;
    rapl.now = 10.0 * i;
    cpu.set(i++);
    sampler.sample_now();
    clock.advance(0.1);
  }
  const EnergyResult e = sampler.energy();
  EXPECT_EQ(e.source, "nvml");
  ASSERT_TRUE(e.joules.has_value());
  EXPECT_DOUBLE_EQ(*e.joules, 300.0);
  EXPECT_TRUE(contains(e.detail, "Fake GPU")) << e.detail;
  EXPECT_FALSE(e.co2_g.has_value());
  const auto s = sampler.samples();
  ASSERT_TRUE(s[0].energy_j && s[3].energy_j && s[5].energy_j);
  EXPECT_DOUBLE_EQ(*s[0].energy_j, 0.0);
  EXPECT_DOUBLE_EQ(*s[3].energy_j, 120.0);
  EXPECT_DOUBLE_EQ(*s[5].energy_j, 300.0);
}

TEST(SamplerEnergy, FallsBackToPowerIntegration) {
  FakeClock clock;
  FakeGpuSensor gpu;
  FakeCounter rapl;
  rapl.now = 0.0;
  Sampler sampler({nullptr, &gpu, &rapl, {}}, {}, clock);
  for (int t = 0; t <= 4; ++t) {  // P(t) = 100 + 50 t W, no energy counter
    clock.set(t);
    gpu.now.power_w = 100.0 + 50.0 * t;
    sampler.sample_now();
  }
  const EnergyResult e = sampler.energy();
  EXPECT_EQ(e.source, "nvml-power");
  EXPECT_DOUBLE_EQ(e.joules.value_or(-1), 800.0);
  EXPECT_TRUE(contains(e.detail, "no energy counter")) << e.detail;
  EXPECT_DOUBLE_EQ(sampler.samples().back().energy_j.value_or(-1), 800.0);
}

TEST(SamplerEnergy, FallsBackToRaplThenToTheEstimate) {
  FakeClock clock;
  FakeCpuSensor cpu;
  FakeGpuSensor gpu;  // reports neither energy nor power
  FakeCounter rapl;
  rapl.wrap = 100.0;
  SamplerOptions options;
  options.watts_per_core = 10.0;
  Sampler with_rapl({&cpu, &gpu, &rapl, {}}, options, clock);
  Sampler without({&cpu, &gpu, nullptr, {}}, options, clock);
  int i = 0;
  for (double r : {90.0, 95.0, 5.0}) {  // wraps: 5 + 10 J
    rapl.now = r;
    cpu.set(1.0 + 0.5 * i++);
    with_rapl.sample_now();
    without.sample_now();
    clock.advance(1.0);
  }
  const EnergyResult e = with_rapl.energy();
  EXPECT_EQ(e.source, "rapl");
  EXPECT_DOUBLE_EQ(e.joules.value_or(-1), 15.0);
  EXPECT_TRUE(contains(e.detail, "fake RAPL")) << e.detail;
  EXPECT_TRUE(contains(e.detail, "every process on the machine")) << e.detail;
  EXPECT_TRUE(contains(e.detail, "wrapped 1 time(s)")) << e.detail;

  const EnergyResult est = without.energy();
  EXPECT_EQ(est.source, "estimate");
  EXPECT_DOUBLE_EQ(est.joules.value_or(-1), 10.0);  // 1 CPU second x 10 W
  EXPECT_TRUE(contains(est.detail, "estimate")) << est.detail;
  EXPECT_TRUE(contains(est.detail, "10 W per core")) << est.detail;
  EXPECT_DOUBLE_EQ(without.samples()[1].energy_j.value_or(-1), 5.0);
}

TEST(SamplerEnergy, CounterLostPartWayKeepsWhatItIntegrated) {
  FakeClock clock;
  FakeGpuSensor gpu;
  FakeCpuSensor cpu;
  Sampler sampler({&cpu, &gpu, nullptr, {}}, {}, clock);
  const std::optional<double> readings[] = {100.0, 150.0, 180.0, std::nullopt, std::nullopt};
  for (const auto& r : readings) {
    gpu.now.energy_j = r;
    cpu.set(clock.now_s());
    sampler.sample_now();
    clock.advance(1.0);
  }
  const EnergyResult e = sampler.energy();
  EXPECT_EQ(e.source, "nvml");
  EXPECT_DOUBLE_EQ(e.joules.value_or(-1), 80.0);
  EXPECT_TRUE(contains(e.detail, "read only from t=0.000 s to t=2.000 s of a 4.000 s run"))
      << e.detail;
  const auto s = sampler.samples();
  EXPECT_DOUBLE_EQ(s[2].energy_j.value_or(-1), 80.0);
  EXPECT_FALSE(s[4].energy_j.has_value());
}

TEST(SamplerEnergy, PartialCounterGivesWayToFullPowerOfTheSameGpu) {
  FakeClock clock;
  FakeGpuSensor gpu;
  Sampler sampler({nullptr, &gpu, nullptr, {}}, {}, clock);
  const std::optional<double> readings[] = {100.0, 150.0, std::nullopt};
  for (const auto& r : readings) {
    gpu.now.energy_j = r;
    gpu.now.power_w = 60.0;
    sampler.sample_now();
    clock.advance(1.0);
  }
  const EnergyResult e = sampler.energy();
  EXPECT_EQ(e.source, "nvml-power");
  EXPECT_DOUBLE_EQ(e.joules.value_or(-1), 120.0);
  EXPECT_TRUE(contains(e.detail, "only part of the run")) << e.detail;
}

TEST(SamplerEnergy, NothingToMeasure) {
  FakeClock clock;
  FakeCpuSensor cpu;  // never readable
  Sampler sampler({&cpu, nullptr, nullptr, {}}, {}, clock);
  EXPECT_EQ(sampler.energy().detail, "fewer than two samples: no interval to measure");
  sampler.sample_now();
  EXPECT_FALSE(sampler.energy().joules.has_value());
  clock.advance(1.0);
  sampler.sample_now();
  const EnergyResult e = sampler.energy();
  EXPECT_FALSE(e.joules.has_value());
  EXPECT_EQ(e.source, "");
  EXPECT_TRUE(contains(e.detail, "process CPU time could not be read")) << e.detail;
  const nlohmann::json j = energy_json(e);
  EXPECT_TRUE(j["joules"].is_null());
  EXPECT_TRUE(j["source"].is_null());
  EXPECT_TRUE(j["co2_g"].is_null());
  EXPECT_TRUE(j["detail"].is_string());
  EXPECT_FALSE(sampler.samples()[1].energy_j.has_value());
}

TEST(SamplerEnergy, CarbonFromGridIntensity) {
  FakeClock clock;
  FakeGpuSensor gpu;
  SamplerOptions options;
  options.grid_g_per_kwh = 400.0;
  Sampler sampler({nullptr, &gpu, nullptr, {}}, options, clock);
  gpu.now.energy_j = 0.0;
  sampler.sample_now();
  clock.advance(3600.0);
  gpu.now.energy_j = 1.8e6;  // 0.5 kWh, e.g. 500 W for an hour
  sampler.sample_now();
  const EnergyResult e = sampler.energy();
  ASSERT_TRUE(e.co2_g.has_value());
  EXPECT_DOUBLE_EQ(*e.co2_g, 200.0);  // 0.5 kWh x 400 g/kWh
  const nlohmann::json j = energy_json(e);
  EXPECT_DOUBLE_EQ(j["joules"].get<double>(), 1.8e6);
  EXPECT_EQ(j["source"], "nvml");
  EXPECT_DOUBLE_EQ(j["co2_g"].get<double>(), 200.0);
}

TEST(SamplerOptions, BadValuesAreUsageErrors) {
  FakeClock clock;
  auto make = [&](SamplerOptions o) { Sampler s({}, o, clock); };
  SamplerOptions o;
  o.period_s = 0;
  EXPECT_THROW(make(o), Error);
  o = {};
  o.threads = 0;
  EXPECT_THROW(make(o), Error);
  o = {};
  o.watts_per_core = -1;
  EXPECT_THROW(make(o), Error);
  o = {};
  o.grid_g_per_kwh = -5;
  EXPECT_THROW(make(o), Error);
  EXPECT_NO_THROW(make({}));
}

// ---------------------------------------------------------------------------------------
// Sampler on its thread, with the real clock and /proc

TEST(SamplerThread, SamplesEveryPeriodAndStopsPromptly) {
  SteadyClock clock;
  ProcCpuSensor cpu;
  std::atomic<int> calls{0};
  SamplerOptions options;
  options.period_s = 0.01;
  Sampler sampler({&cpu, nullptr, nullptr, [&] { return int64_t{++calls}; }}, options, clock);
  sampler.start();
  EXPECT_EQ(sampler.samples().size(), 1u);  // the first one is taken at once
  sampler.start();                          // does nothing
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const auto t0 = std::chrono::steady_clock::now();
  sampler.stop();
  const double stop_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(stop_s, 0.2);

  const auto s = sampler.samples();
  EXPECT_GE(s.size(), 5u);  // ~16 expected; loose, the machine is shared
  for (size_t i = 1; i < s.size(); ++i) {
    EXPECT_GT(s[i].t_s, s[i - 1].t_s);
    EXPECT_TRUE(s[i].rss_bytes.has_value());
    EXPECT_EQ(s[i].allocated_bytes, static_cast<int64_t>(i + 1));
  }
  EXPECT_GT(sampler.sampling_seconds(), 0.0);
  EXPECT_TRUE(sampler.thread_error().empty());
  EXPECT_EQ(sampler.energy().source, "estimate");

  sampler.stop();  // idempotent: no further sample
  EXPECT_EQ(sampler.samples().size(), s.size());
}

TEST(SamplerThread, StopDoesNotWaitForALongPeriod) {
  SteadyClock clock;
  ProcCpuSensor cpu;
  SamplerOptions options;
  options.period_s = 10.0;
  auto sampler =
      std::make_unique<Sampler>(SamplerSources{&cpu, nullptr, nullptr, {}}, options, clock);
  sampler->start();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto t0 = std::chrono::steady_clock::now();
  sampler.reset();  // the destructor stops it
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.2);
}

TEST(SamplerThread, AThrowingSourceEndsTheThreadNotTheProcess) {
  SteadyClock clock;
  std::atomic<int> calls{0};
  SamplerOptions options;
  options.period_s = 0.005;
  Sampler sampler({nullptr, nullptr, nullptr,
                   [&]() -> int64_t {
                     if (++calls >= 3) throw std::runtime_error("allocator stats gone");
                     return 0;
                   }},
                  options, clock);
  sampler.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  sampler.stop();
  EXPECT_EQ(sampler.thread_error(), "allocator stats gone");
  EXPECT_EQ(sampler.samples().size(), 2u);
}

TEST(SamplerThread, StopWithoutStartDoesNothing) {
  FakeClock clock;
  FakeCpuSensor cpu;
  Sampler sampler({&cpu, nullptr, nullptr, {}}, {}, clock);
  sampler.stop();
  EXPECT_TRUE(sampler.samples().empty());
  EXPECT_FALSE(sampler.origin_s().has_value());
}

}  // namespace
}  // namespace gradscope
