#include "gradscope/report/contrasts.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace gradscope {

namespace {

// Per seed both sides ran (each side naming a seed once), a's value minus b's; empty when a
// side names a seed twice or they share fewer than kMinPairedSeeds.
std::vector<double> paired_differences(const std::vector<double>& a,
                                       const std::vector<uint64_t>& seeds_a,
                                       const std::vector<double>& b,
                                       const std::vector<uint64_t>& seeds_b) {
  std::map<uint64_t, double> of_a, of_b;
  for (size_t i = 0; i < a.size(); ++i)
    if (!of_a.emplace(seeds_a[i], a[i]).second) return {};
  for (size_t i = 0; i < b.size(); ++i)
    if (!of_b.emplace(seeds_b[i], b[i]).second) return {};
  std::vector<double> d;
  for (const auto& [seed, x] : of_a)
    if (const auto it = of_b.find(seed); it != of_b.end()) d.push_back(x - it->second);
  if (static_cast<int>(d.size()) < kMinPairedSeeds) return {};
  return d;
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
  const std::vector<double> d = seeds_a.size() == a.size() && seeds_b.size() == b->size()
                                    ? paired_differences(fa, seeds_a, fb, seeds_b)
                                    : std::vector<double>{};
  if (!d.empty()) {
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
