// The statistics gradscope computes, in one place: medians and percentiles of measurements
// (step times, utilization), means over seeds with their 95% Student-t intervals, and Welch's
// t test of two sets of per-seed values (the report's verdicts rest on it).
#pragma once

#include <limits>
#include <vector>

namespace gradscope {

// What the functions below return for no value (and what a missing measurement reads as).
inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The p-th percentile (p in [0, 100]) by linear interpolation between closest ranks; the
// median is the 50th. NaN for no values.
double percentile(std::vector<double> values, double pct);
double median(std::vector<double> values);

// A mean with its 95% confidence half-width (NaN with fewer than two values).
struct Interval {
  double mean = 0;
  double half_width = 0;
  int n = 0;
  bool has_interval() const { return n >= 2; }
  double lo() const { return mean - (has_interval() ? half_width : 0); }
  double hi() const { return mean + (has_interval() ? half_width : 0); }
};
// The mean of `values` and, with n >= 2, t(0.975, n-1) * sd / sqrt(n). Empty: n = 0, NaN mean.
Interval mean_interval(const std::vector<double>& values);
// The sample standard deviation (n - 1 in the denominator); NaN with fewer than two values.
double sample_sd(const std::vector<double>& values);

// The p-quantile of Student's t distribution with `df` degrees of freedom (p in (0, 1)),
// computed from the regularized incomplete beta function, not looked up.
double student_t_quantile(double p, double df);
// P(T <= t) for Student's t with `df` degrees of freedom (df > 0, not necessarily whole).
double student_t_cdf(double t, double df);

// Welch's t test of the means of two samples that may have different variances:
//   t = (mean_a - mean_b) / sqrt(s_a^2 / n_a + s_b^2 / n_b),
//   df = (s_a^2/n_a + s_b^2/n_b)^2 / ((s_a^2/n_a)^2 / (n_a - 1) + (s_b^2/n_b)^2 / (n_b - 1))
// (Welch-Satterthwaite), p two-sided = 2 P(T > |t|). Valid only with n >= 2 on both sides.
// When both samples have no spread the difference of the means is exact: p = 0 when they
// differ, 1 when they are equal.
struct WelchTest {
  bool valid = false;  // both samples have at least two values
  double mean_a = kNaN, mean_b = kNaN;
  double t = kNaN, df = kNaN, p = kNaN;
  // a's mean is above (below) b's, two-sided p < alpha.
  bool above(double alpha = 0.05) const { return valid && p < alpha && mean_a > mean_b; }
  bool below(double alpha = 0.05) const { return valid && p < alpha && mean_a < mean_b; }
};
WelchTest welch_t_test(const std::vector<double>& a, const std::vector<double>& b);
// The one-sample t test of a's mean against mu (df = n - 1): Welch's test against a sample
// with no spread.
WelchTest one_sample_t_test(const std::vector<double>& a, double mu);
// Holm's step-down over a family of tests: which null hypotheses are rejected so that the
// family errs at most alpha. Sorted by p, the k-th smallest (from 0) is rejected while it and
// every smaller one are below alpha / (m - k). One flag per p, in the order given.
std::vector<bool> holm_rejections(const std::vector<double>& p, double alpha);
// The level each p of the family was held to: the k-th smallest at alpha / (m - k) while every
// smaller one was rejected; once one is not, the step-down stops and every larger p was held to
// that one's level. A p is rejected exactly when it is below its level.
std::vector<double> holm_levels(const std::vector<double>& p, double alpha);

}  // namespace gradscope
