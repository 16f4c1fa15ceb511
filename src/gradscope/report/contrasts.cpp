#include "gradscope/report/contrasts.h"

#include <algorithm>
#include <cmath>

namespace gradscope {

namespace {

double sample_sd(const std::vector<double>& v) {
  if (v.size() < 2) return kNaN;
  double sum = 0;
  for (double x : v) sum += x;
  const double mean = sum / v.size();
  double ss = 0;
  for (double x : v) ss += (x - mean) * (x - mean);
  return std::sqrt(ss / (v.size() - 1));
}

// Both sides name the same seeds, each once (then value i of a and of b share seed i after
// sorting by seed).
bool same_seeds(std::vector<uint64_t> a, std::vector<uint64_t> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return !a.empty() && a == b && std::adjacent_find(a.begin(), a.end()) == a.end();
}

// The values in seed order.
std::vector<double> by_seed(const std::vector<double>& v, const std::vector<uint64_t>& seeds) {
  std::vector<size_t> order(v.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return seeds[x] < seeds[y]; });
  std::vector<double> out;
  for (size_t i : order) out.push_back(v[i]);
  return out;
}

// The t test's result in ContrastStat's terms.
void take_test(ContrastStat& s, const WelchTest& w) {
  s.valid = w.valid;
  s.effect = w.mean_a - w.mean_b;
  s.df = w.df;
  s.p = w.p;
}

// (t(1 - alpha/2, df) + t(power, df)) x se: the difference detected with probability kPower.
double detectable_at(double se, double df, double alpha) {
  if (!(df > 0) || !std::isfinite(se)) return kNaN;
  return (student_t_quantile(1 - alpha / 2, df) + student_t_quantile(kPower, df)) * se;
}

}  // namespace

ContrastStat test_contrast(const std::vector<double>& a,
                           const std::optional<std::vector<double>>& b,
                           const std::vector<uint64_t>& seeds_a,
                           const std::vector<uint64_t>& seeds_b, double threshold, bool log_scale) {
  ContrastStat s;
  const auto scale = [log_scale](double x) { return log_scale ? std::log(x) : x; };
  const auto positive = [](const std::vector<double>& v) {
    return std::all_of(v.begin(), v.end(), [](double x) { return x > 0; });
  };
  if (log_scale && (!positive(a) || (b && !positive(*b)) || !(threshold > 0))) return s;
  std::vector<double> fa;
  for (double x : a) fa.push_back(scale(x));
  if (!b) {  // against a constant
    take_test(s, one_sample_t_test(fa, scale(threshold)));
    s.sd = sample_sd(fa);
    s.n = static_cast<int>(fa.size());
    s.se = s.sd / std::sqrt(static_cast<double>(s.n));
    return s;
  }
  // t x b on the contrast's scale.
  std::vector<double> fb;
  for (double x : *b) fb.push_back(log_scale ? std::log(x) + std::log(threshold) : threshold * x);
  if (seeds_a.size() == a.size() && seeds_b.size() == b->size() && same_seeds(seeds_a, seeds_b)) {
    const std::vector<double> sa = by_seed(fa, seeds_a), sb = by_seed(fb, seeds_b);
    std::vector<double> d;
    for (size_t i = 0; i < sa.size(); ++i) d.push_back(sa[i] - sb[i]);
    take_test(s, one_sample_t_test(d, 0));
    s.paired = true;
    s.sd = sample_sd(d);
    s.n = static_cast<int>(d.size());
    s.se = s.sd / std::sqrt(static_cast<double>(s.n));
    return s;
  }
  take_test(s, welch_t_test(fa, fb));
  s.sd_a = sample_sd(fa);
  s.sd_b = sample_sd(fb);
  s.n = static_cast<int>(std::min(fa.size(), fb.size()));
  if (s.valid) s.se = std::sqrt(s.sd_a * s.sd_a / fa.size() + s.sd_b * s.sd_b / fb.size());
  return s;
}

double detectable_effect(const ContrastStat& s, double alpha) {
  if (!s.valid) return kNaN;
  return detectable_at(s.se, s.df, alpha);
}

std::optional<int> seeds_needed(const ContrastStat& s, double alpha) {
  if (!s.valid || !(std::abs(s.effect) > 0) || !std::isfinite(s.effect)) return std::nullopt;
  const bool one_spread = !std::isnan(s.sd);
  const double va = one_spread ? s.sd * s.sd : s.sd_a * s.sd_a;
  const double vb = one_spread ? 0 : s.sd_b * s.sd_b;
  if (!(va + vb > 0)) return std::max(s.n, 2);  // no spread: the difference is exact
  for (int n = 2; n <= kMaxSeedsNeeded; ++n) {
    const double se = std::sqrt((va + vb) / n);
    // Welch-Satterthwaite with n seeds on each side; n - 1 for one spread.
    const double df = one_spread ? n - 1.0 : (va + vb) * (va + vb) * (n - 1) / (va * va + vb * vb);
    if (detectable_at(se, df, alpha) <= std::abs(s.effect)) return n;
  }
  return std::nullopt;
}

}  // namespace gradscope
