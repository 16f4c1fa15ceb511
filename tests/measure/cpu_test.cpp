#include "gradscope/measure/cpu.h"

#include <gtest/gtest.h>
#include <time.h>

#include <chrono>
#include <thread>

namespace gradscope {
namespace {

TEST(CpuUtilization, Formula) {
  EXPECT_DOUBLE_EQ(cpu_utilization_pct(1.0, 1.0, 1), 100.0);
  EXPECT_DOUBLE_EQ(cpu_utilization_pct(1.0, 1.0, 2), 50.0);
  EXPECT_DOUBLE_EQ(cpu_utilization_pct(3.0, 1.0, 2), 150.0);  // reported, not clamped
  EXPECT_DOUBLE_EQ(cpu_utilization_pct(1.0, 0.0, 1), 0.0);
  EXPECT_DOUBLE_EQ(cpu_utilization_pct(1.0, 1.0, 0), 0.0);
}

TEST(CpuUtilization, ProcessCpuTimeIsMonotonic) {
  const double a_s = process_cpu_seconds();
  EXPECT_GE(a_s, 0.0);
  EXPECT_GE(process_cpu_seconds(), a_s);
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// The build machine is shared, so a busy thread may get much less than a whole core. The
// test checks the accounting against what the scheduler really gave this thread, and keeps
// only a loose absolute bound.
TEST(CpuUtilization, BusyLoopIsAboutOneFullThread) {
  CpuUtilization util(1);
  const double thread_start_s = thread_cpu_seconds();
  volatile double sink = 0.0;
  while (util.wall_s() < 0.3) {
    for (int i = 0; i < 10000; ++i) sink = sink + 1e-9 * i;
  }
  const double thread_s = thread_cpu_seconds() - thread_start_s;
  const double pct = util.pct();
  const double given_pct = thread_s / util.wall_s() * 100.0;
  EXPECT_NEAR(pct, given_pct, 15.0) << "cpu " << util.cpu_s() << " s, wall " << util.wall_s();
  EXPECT_GT(pct, 15.0);
  EXPECT_LT(pct, 110.0);
}

TEST(CpuUtilization, SleepIsAboutZero) {
  CpuUtilization util(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_LT(util.pct(), 10.0);
  EXPECT_GE(util.pct(), 0.0);
  util.restart();
  EXPECT_LT(util.wall_s(), 0.2);
}

}  // namespace
}  // namespace gradscope
