// Readings of what competes for the CPUs: /proc/stat's steal time, runnable tasks and CPUs,
// and one step's figures from the readings at its start and end.
#include "gradscope/measure/contention.h"

#include <gtest/gtest.h>

namespace gradscope {
namespace {

const char kProcStat[] =
    "cpu  1468048 505 136180 642493 3498 0 720 2298 0 0\n"
    "cpu0 654453 297 60066 408990 1262 0 153 1160 0 0\n"
    "cpu1 813595 208 76114 233502 2235 0 567 1138 0 0\n"
    "intr 123 4 5\n"
    "ctxt 99999\n"
    "procs_running 10\n"
    "procs_blocked 0\n";

TEST(ContentionReadings, ProcStatGivesStealRunnableTasksAndCpus) {
  const ProcStat s = parse_proc_stat(kProcStat, 100);
  ASSERT_TRUE(s.steal_s);
  EXPECT_DOUBLE_EQ(*s.steal_s, 22.98);  // 2298 ticks of 1/100 s
  ASSERT_TRUE(s.procs_running);
  EXPECT_EQ(*s.procs_running, 10);
  EXPECT_EQ(s.cpus, 2);
  // A kernel too old for a steal column, and text that is not /proc/stat.
  const ProcStat old = parse_proc_stat("cpu 1 2 3 4 5 6 7\ncpu0 1 2 3 4 5 6 7\n", 100);
  EXPECT_FALSE(old.steal_s);
  EXPECT_FALSE(old.procs_running);
  EXPECT_EQ(old.cpus, 1);
  EXPECT_FALSE(parse_proc_stat("procs_running many\n", 100).procs_running);
}

TEST(ContentionReadings, AStepCountsItsOwnSwitchesStealAndTheTasksBeyondItsThreads) {
  ContentionReading start{100, 5.0, 3}, end{130, 5.5, 5};
  const StepContention s = step_contention(start, end, 2);
  EXPECT_EQ(s.involuntary_switches, 30);
  EXPECT_DOUBLE_EQ(*s.steal_s, 0.5);
  EXPECT_DOUBLE_EQ(*s.competing_tasks, 2.0);  // (3 - 2 + 5 - 2) / 2
  // Its own threads alone are no competition; what could not be read stays unknown.
  const StepContention quiet = step_contention({1, std::nullopt, 2}, {1, std::nullopt, 1}, 2);
  EXPECT_EQ(quiet.involuntary_switches, 0);
  EXPECT_FALSE(quiet.steal_s);
  EXPECT_DOUBLE_EQ(*quiet.competing_tasks, 0.0);
}

TEST(ContentionReadings, ThisProcessCanBeRead) {
  const ContentionReading r = read_contention();
  ASSERT_TRUE(r.involuntary_switches);  // getrusage works everywhere gradscope runs
  EXPECT_GE(*r.involuntary_switches, 0);
  ASSERT_TRUE(r.procs_running);         // Linux's /proc/stat
  EXPECT_GE(*r.procs_running, 1);       // this thread, reading it
  EXPECT_GE(machine_cpus(), 1);
}

}  // namespace
}  // namespace gradscope
