#include "gradscope/core/statistics.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "gradscope/core/error.h"

namespace gradscope {
namespace {

// The regularized incomplete beta function I_x(a, b), by its continued fraction.
double incomplete_beta(double x, double a, double b) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  if (x > (a + 1) / (a + b + 2)) return 1 - incomplete_beta(1 - x, b, a);
  const double front = std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) +
                                a * std::log(x) + b * std::log1p(-x)) /
                       a;
  const double tiny = 1e-300;
  double c = 1, d = 1 - (a + b) * x / (a + 1);
  d = 1 / (std::abs(d) < tiny ? tiny : d);
  double f = d;
  for (int m = 1; m <= 300; ++m) {
    for (int odd = 0; odd < 2; ++odd) {
      const double num = odd == 0 ? m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
                                  : -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1));
      d = 1 + num * d;
      d = 1 / (std::abs(d) < tiny ? tiny : d);
      c = 1 + num / c;
      c = std::abs(c) < tiny ? tiny : c;
      f *= c * d;
    }
    if (std::abs(c * d - 1) < 1e-15) break;
  }
  return front * f;
}

}  // namespace

double percentile(std::vector<double> values, double pct) {
  if (values.empty()) return kNaN;
  std::sort(values.begin(), values.end());
  // Linear interpolation between closest ranks.
  const double rank = pct / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(values.size() - 1, lo + 1);
  return values[lo] + (values[hi] - values[lo]) * (rank - static_cast<double>(lo));
}

double median(std::vector<double> values) { return percentile(std::move(values), 50); }

double student_t_quantile(double p, double df) {
  check_usage(p > 0 && p < 1 && df > 0, "student_t_quantile: p must be in (0, 1), df positive");
  if (p < 0.5) return -student_t_quantile(1 - p, df);
  auto cdf = [df](double t) { return 1 - 0.5 * incomplete_beta(df / (df + t * t), df / 2, 0.5); };
  double lo = 0, hi = 1;
  while (cdf(hi) < p) hi *= 2;
  for (int i = 0; i < 200 && hi - lo > 1e-12 * hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    (cdf(mid) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

Interval mean_interval(const std::vector<double>& values) {
  Interval i;
  i.n = static_cast<int>(values.size());
  if (i.n == 0) {
    i.mean = kNaN;
    return i;
  }
  double sum = 0;
  for (double v : values) sum += v;
  i.mean = sum / i.n;
  if (i.n < 2) {
    i.half_width = kNaN;
    return i;
  }
  double ss = 0;
  for (double v : values) ss += (v - i.mean) * (v - i.mean);
  const double sd = std::sqrt(ss / (i.n - 1));
  i.half_width = student_t_quantile(0.975, i.n - 1) * sd / std::sqrt(static_cast<double>(i.n));
  return i;
}

}  // namespace gradscope
