// Whether a run's timings are disturbed, from its timed steps' competition (core/contention.h):
// each threshold alone marks a run, a quiet run is not marked, and no readings are no verdict.
#include "gradscope/core/contention.h"

#include <gtest/gtest.h>

#include <vector>

#include "test_util.h"

namespace gradscope {
namespace {

std::vector<StepContention> steps_of(int n, StepContention s) {
  return std::vector<StepContention>(static_cast<size_t>(n), s);
}

TEST(ContentionVerdict, AQuietRunIsNotDisturbed) {
  // 20 steps of 20 ms, two threads on two CPUs: a switch now and then, nothing else runnable.
  const RunContention c =
      summarize_contention(steps_of(20, {1, 0.0, 0.0}), std::vector<double>(20, 0.02), 2, 2);
  EXPECT_EQ(c.steps, 20);
  EXPECT_EQ(*c.involuntary_switches, 20);
  EXPECT_DOUBLE_EQ(*c.involuntary_switches_per_s, 50.0);  // 20 in 0.4 s, below 2 x 75
  EXPECT_DOUBLE_EQ(*c.steal_pct, 0.0);
  EXPECT_DOUBLE_EQ(*c.excess_tasks_mean, 0.0);
  EXPECT_FALSE(c.disturbed);
  EXPECT_TRUE(c.reasons.empty());
}

TEST(ContentionVerdict, ATaskOnTheRunsCoresMarksIt) {
  // A busy loop beside a run of two threads on two CPUs: one task more than the idle CPUs.
  const RunContention c =
      summarize_contention(steps_of(10, {0, 0.0, 1.0}), std::vector<double>(10, 0.02), 2, 2);
  EXPECT_DOUBLE_EQ(*c.excess_tasks_mean, 1.0);
  ASSERT_TRUE(c.disturbed);
  ASSERT_EQ(c.reasons.size(), 1u);
  EXPECT_NE(c.reasons[0].find("1.00 runnable tasks besides the run's 2 threads on 2 CPUs"),
            std::string::npos)
      << c.reasons[0];
  // The same task where an idle CPU takes it does not disturb a run of one thread.
  EXPECT_FALSE(
      summarize_contention(steps_of(10, {0, 0.0, 1.0}), std::vector<double>(10, 0.02), 1, 2)
          .disturbed);
}

TEST(ContentionVerdict, PreemptionsOrStealAloneMarkIt) {
  // 10 switches in a 20 ms step: 500 a second, for one thread (threshold 75).
  const RunContention switches =
      summarize_contention(steps_of(5, {10, std::nullopt, std::nullopt}),
                           std::vector<double>(5, 0.02), 1, 8);
  EXPECT_TRUE(switches.disturbed);
  EXPECT_FALSE(switches.steal_s);
  // 0.01 s stolen per 20 ms step on 4 CPUs: 12.5% of the machine's CPU time.
  const RunContention steal = summarize_contention(steps_of(5, {0, 0.01, 0.0}),
                                                   std::vector<double>(5, 0.02), 1, 4);
  EXPECT_DOUBLE_EQ(*steal.steal_pct, 12.5);
  EXPECT_TRUE(steal.disturbed);
}

TEST(ContentionVerdict, StepsWithoutReadingsGiveNoVerdict) {
  const RunContention c = summarize_contention(steps_of(3, {}), std::vector<double>(3, 0.1), 1, 1);
  EXPECT_EQ(c.steps, 0);
  EXPECT_FALSE(c.involuntary_switches);
  EXPECT_FALSE(c.competing_tasks_mean);
  EXPECT_FALSE(c.disturbed);
}

TEST(ContentionVerdict, TheRunsOwnSamplerIsNoCompetitor) {
  // 20 switches in a 20 ms step of two threads: 1000 a second, over 2 x 75, but a sampler of
  // 1 ms wakes 1000 times a second besides.
  const auto steps = steps_of(5, {20, std::nullopt, std::nullopt});
  const std::vector<double> times(5, 0.02);
  EXPECT_TRUE(summarize_contention(steps, times, 2, 2).disturbed);
  DisturbanceThresholds sampled;
  sampled.own_wakeups_per_s = 1000;
  EXPECT_FALSE(summarize_contention(steps, times, 2, 2, sampled).disturbed);
  sampled.own_wakeups_per_s = 100;
  const RunContention c = summarize_contention(steps, times, 2, 2, sampled);
  ASSERT_TRUE(c.disturbed);
  EXPECT_TRUE(testing::contains(c.reasons[0], "threshold 250: 75 per thread, and 100 of the "
                                              "run's sampler"))
      << c.reasons[0];
}

}  // namespace
}  // namespace gradscope
