#include <cmath>

#include <gtest/gtest.h>

#include "gradscope/core/config.h"
#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/registry.h"
#include "gradscope/core/rng.h"
#include "gradscope/core/settings.h"
#include "gradscope/core/statistics.h"

namespace gradscope {
namespace {

TEST(Registry, UnknownNameListsValidOnes) {
  Registry<int> reg("widget");
  reg.add("alpha", "first", 1).add("beta", "second", 2);
  EXPECT_EQ(reg.get("beta"), 2);
  try {
    reg.get("gamma");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("gamma"), std::string::npos);
    EXPECT_NE(e.hint().find("alpha, beta"), std::string::npos);
  }
}

TEST(ParseBytes, UnitsAndErrors) {
  EXPECT_EQ(parse_bytes("1000000"), 1000000);
  EXPECT_EQ(parse_bytes("512MiB"), 512LL * 1024 * 1024);
  EXPECT_EQ(parse_bytes("8GiB"), 8LL * 1024 * 1024 * 1024);
  EXPECT_EQ(parse_bytes("2GB"), 2000000000LL);
  EXPECT_THROW(parse_bytes("lots"), Error);
  EXPECT_THROW(parse_bytes("1e19"), Error);  // past int64: must not wrap to a negative count
  EXPECT_THROW(parse_bytes("10000000TB"), Error);
  EXPECT_EQ(parse_bytes("1e18"), 1000000000000000000LL);
  EXPECT_THROW(parse_bytes("5 parsecs"), Error);
  EXPECT_THROW(parse_bytes("-5"), Error);
}

TEST(RunId, IgnoresThreadsPathsAndDeviceIndex) {
  RunConfig a;
  RunConfig b = a;
  b.threads = 7;
  b.db_path = "elsewhere.db";
  b.json_path = "x.json";
  b.device = "cpu";
  EXPECT_EQ(run_id_of(canonical_config_json(a)), run_id_of(canonical_config_json(b)));
  b.seed = 1;
  EXPECT_NE(run_id_of(canonical_config_json(a)), run_id_of(canonical_config_json(b)));
  RunConfig c0, c1;
  c0.device = "cuda:0";
  c1.device = "cuda:1";
  EXPECT_EQ(run_id_of(canonical_config_json(c0)), run_id_of(canonical_config_json(c1)));
}

TEST(Rng, CounterBasedHashIsDeterministicAndSpread) {
  EXPECT_EQ(hash3(1, 2, 3), hash3(1, 2, 3));
  EXPECT_NE(hash3(1, 2, 3), hash3(1, 2, 4));
  double sum = 0;
  for (int i = 0; i < 10000; ++i) sum += unit_double(hash3(7, 0, i));
  EXPECT_NEAR(sum / 10000, 0.5, 0.02);
}

TEST(Statistics, StudentTCdfMatchesClosedForms) {
  // df = 1 is Cauchy: 1/2 + atan(t) / pi; df = 2: 1/2 + t / (2 sqrt(2 + t^2)).
  EXPECT_NEAR(student_t_cdf(1.0, 1), 0.75, 1e-12);
  EXPECT_NEAR(student_t_cdf(-3.0, 1), 0.5 + std::atan(-3.0) / M_PI, 1e-12);
  EXPECT_NEAR(student_t_cdf(2.0, 2), 0.5 + 2.0 / (2 * std::sqrt(6.0)), 1e-12);
  // The 97.5% points of t tables.
  EXPECT_NEAR(student_t_cdf(2.228138852, 10), 0.975, 1e-8);
  EXPECT_NEAR(student_t_cdf(4.302652730, 2), 0.975, 1e-8);
  EXPECT_DOUBLE_EQ(student_t_cdf(0, 7.5), 0.5);
}

// R's sleep data set (Student 1908): extra hours of sleep under two drugs.
const std::vector<double> kSleep1 = {0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0};
const std::vector<double> kSleep2 = {1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4};

TEST(Statistics, WelchTestMatchesR) {
  // R: t.test(extra ~ group, data = sleep) gives t = -1.8608, df = 17.776, p-value = 0.07939.
  const WelchTest w = welch_t_test(kSleep1, kSleep2);
  ASSERT_TRUE(w.valid);
  EXPECT_NEAR(w.t, -1.8608, 1e-4);
  EXPECT_NEAR(w.df, 17.776, 1e-3);
  EXPECT_NEAR(w.p, 0.07939, 1e-5);
  EXPECT_FALSE(w.below());  // not at 95%
  EXPECT_TRUE(w.below(0.1));
  // R: t.test(sleep$extra[1:10], mu = 0) gives t = 1.3257, df = 9, p-value = 0.2176.
  const WelchTest one = one_sample_t_test(kSleep1, 0);
  EXPECT_NEAR(one.t, 1.3257, 1e-4);
  EXPECT_DOUBLE_EQ(one.df, 9);
  EXPECT_NEAR(one.p, 0.2176, 1e-4);
}

TEST(Statistics, WelchTestNeedsTwoValuesAndHandlesNoSpread) {
  EXPECT_FALSE(welch_t_test({1.0}, {1.0 + 1e-7}).valid);
  EXPECT_FALSE(welch_t_test({1, 2, 3}, {}).valid);
}

// Holm's step-down against hand-worked families: it rejects more than Bonferroni (alpha / m)
// once the smallest p is rejected, and stops at the first that is not.
TEST(Statistics, HolmStepsDownAndStopsAtTheFirstKeptHypothesis) {
  // m = 2: 0.001 < 0.025, then 0.03 < 0.05: both; Bonferroni would keep 0.03.
  EXPECT_EQ(holm_rejections({0.03, 0.001}, 0.05), (std::vector<bool>{true, true}));
  // m = 3: 0.01 < 0.0167, 0.03 > 0.025: stop; 0.04 is kept although below 0.05.
  EXPECT_EQ(holm_rejections({0.04, 0.01, 0.03}, 0.05), (std::vector<bool>{false, true, false}));
  // m = 6, all 0.033: the first needs 0.0083.
  EXPECT_EQ(holm_rejections(std::vector<double>(6, 0.033), 0.05), std::vector<bool>(6, false));
  EXPECT_TRUE(holm_rejections({}, 0.05).empty());
  // The levels they were held to: 0.01 at 0.05 / 3; 0.03 at 0.05 / 2, where the step-down
  // stops, so 0.04 was held to 0.025 too, not to 0.05.
  const std::vector<double> levels = holm_levels({0.04, 0.01, 0.03}, 0.05);
  ASSERT_EQ(levels.size(), 3u);
  EXPECT_DOUBLE_EQ(levels[0], 0.025);
  EXPECT_DOUBLE_EQ(levels[1], 0.05 / 3);
  EXPECT_DOUBLE_EQ(levels[2], 0.025);
  const WelchTest exact = welch_t_test({1, 1, 1}, {2, 2, 2});
  EXPECT_TRUE(exact.valid);
  EXPECT_DOUBLE_EQ(exact.p, 0);
  EXPECT_TRUE(exact.below());
  EXPECT_DOUBLE_EQ(welch_t_test({1, 1, 1}, {1, 1, 1}).p, 1);
}

}  // namespace
}  // namespace gradscope
