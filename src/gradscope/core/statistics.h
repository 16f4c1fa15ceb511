// The statistics gradscope computes, in one place: medians and percentiles of measurements
// (step times, utilization) and means over seeds with their 95% Student-t intervals.
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

// The p-quantile of Student's t distribution with `df` degrees of freedom (p in (0, 1)),
// computed from the regularized incomplete beta function, not looked up.
double student_t_quantile(double p, double df);

}  // namespace gradscope
