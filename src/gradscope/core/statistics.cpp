#include "gradscope/core/statistics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

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

double student_t_cdf(double t, double df) {
  check_usage(df > 0 && !std::isnan(t), "student_t_cdf: df must be positive, t a number");
  if (std::isinf(t)) return t > 0 ? 1 : 0;
  // P(|T| > |t|) = I_{df / (df + t^2)}(df / 2, 1 / 2).
  const double tail = 0.5 * incomplete_beta(df / (df + t * t), df / 2, 0.5);
  return t >= 0 ? 1 - tail : tail;
}

namespace {

struct Moments {
  int n = 0;
  double mean = kNaN, var = kNaN;  // var: the unbiased sample variance
};

Moments moments_of(const std::vector<double>& v) {
  Moments m;
  m.n = static_cast<int>(v.size());
  if (m.n == 0) return m;
  double sum = 0;
  for (double x : v) sum += x;
  m.mean = sum / m.n;
  if (m.n < 2) return m;
  double ss = 0;
  for (double x : v) ss += (x - m.mean) * (x - m.mean);
  m.var = ss / (m.n - 1);
  return m;
}

// Welch's test from the two samples' moments; an exact side (var 0, n "infinite") is a
// constant.
WelchTest welch_from(const Moments& a, const Moments& b, bool b_exact) {
  WelchTest w;
  w.mean_a = a.mean;
  w.mean_b = b.mean;
  if (a.n < 2 || (!b_exact && b.n < 2)) return w;
  w.valid = true;
  const double va = a.var / a.n;
  const double vb = b_exact ? 0 : b.var / b.n;
  const double se2 = va + vb;
  if (!(se2 > 0)) {  // no spread on either side: the difference is exact
    w.df = b_exact ? a.n - 1 : a.n + b.n - 2;
    const bool same = a.mean == b.mean;
    w.t = same ? 0 : (a.mean > b.mean ? 1 : -1) * std::numeric_limits<double>::infinity();
    w.p = same ? 1 : 0;
    return w;
  }
  w.t = (a.mean - b.mean) / std::sqrt(se2);
  const double denom = va * va / (a.n - 1) + (b_exact ? 0 : vb * vb / (b.n - 1));
  w.df = se2 * se2 / denom;
  w.p = 2 * student_t_cdf(-std::abs(w.t), w.df);
  return w;
}

}  // namespace

WelchTest welch_t_test(const std::vector<double>& a, const std::vector<double>& b) {
  return welch_from(moments_of(a), moments_of(b), false);
}

WelchTest one_sample_t_test(const std::vector<double>& a, double mu) {
  Moments b;
  b.n = 1;
  b.mean = mu;
  b.var = 0;
  return welch_from(moments_of(a), b, true);
}

double student_t_quantile(double p, double df) {
  check_usage(p > 0 && p < 1 && df > 0, "student_t_quantile: p must be in (0, 1), df positive");
  if (p < 0.5) return -student_t_quantile(1 - p, df);
  auto cdf = [df](double t) { return student_t_cdf(t, df); };
  double lo = 0, hi = 1;
  while (cdf(hi) < p) hi *= 2;
  for (int i = 0; i < 200 && hi - lo > 1e-12 * hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    (cdf(mid) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

double sample_sd(const std::vector<double>& values) {
  const Moments m = moments_of(values);
  return m.n < 2 ? kNaN : std::sqrt(m.var);
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
  const double sd = sample_sd(values);
  i.half_width = student_t_quantile(0.975, i.n - 1) * sd / std::sqrt(static_cast<double>(i.n));
  return i;
}

std::vector<double> holm_levels(const std::vector<double>& p, double alpha) {
  std::vector<size_t> order(p.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] < p[b]; });
  std::vector<double> level(p.size());
  const size_t m = p.size();
  std::optional<double> stopped;  // the level where the step-down stopped
  for (size_t k = 0; k < m; ++k) {
    const double own = alpha / static_cast<double>(m - k);
    if (!stopped && !(p[order[k]] < own)) stopped = own;
    level[order[k]] = stopped.value_or(own);
  }
  return level;
}

std::vector<bool> holm_rejections(const std::vector<double>& p, double alpha) {
  const std::vector<double> level = holm_levels(p, alpha);
  std::vector<bool> rejected(p.size());
  for (size_t i = 0; i < p.size(); ++i) rejected[i] = p[i] < level[i];
  return rejected;
}

}  // namespace gradscope
