// How one comparison behind a claim (a contrast) is tested, and what it could have detected.
//
// A contrast holds per-seed values a against per-seed values b scaled by a threshold (or a
// against a constant). On the linear scale the question is a - t x b; on the log scale (ratio
// claims: a loss ratio, a step-time ratio) it is log a - log b - log t, so that one outlier seed
// weighs as a factor, not as an absolute amount. When both sides ran at least kMinPairedSeeds of
// the same seeds (a seed fixes the initial weights and, at the same batch, the data order) the
// test is paired over those seeds: a one-sample t test of the per-seed differences. Otherwise
// it is Welch's t test of the two sides.
//
// Power: at the level alpha a contrast is held to, with its spread and degrees of freedom, the
// smallest difference it detects 80% of the time is (t(1 - alpha/2, df) + t(0.8, df)) x SE, and
// the seeds a side would need for the observed difference solve the same equation for n.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gradscope/core/statistics.h"

namespace gradscope {

// The power every "could have detected" figure is stated at.
inline constexpr double kPower = 0.8;
// Seeds both sides must share for a paired test; the seeds only one side ran are then left out.
inline constexpr int kMinPairedSeeds = 3;
// Seeds per side beyond which "seeds needed" says "more than this".
inline constexpr int kMaxSeedsNeeded = 1000;

// The test of one contrast against one threshold.
struct ContrastStat {
  bool valid = false;   // at least two values on each side (or a side with no spread)
  bool paired = false;  // one-sample test of per-seed differences
  // a's distance from t x b (from the constant) on the contrast's scale: the mean per-seed
  // difference when paired, the difference of the means otherwise.
  double effect = kNaN;
  double se = kNaN, df = kNaN, p = kNaN;
  // What "seeds needed" scales: the per-seed spread of the differences (paired, or a against
  // a constant), or of each side (Welch).
  double sd = kNaN, sd_a = kNaN, sd_b = kNaN;
  int n = 0;  // seeds per side (paired), or the smaller side
};

// a against threshold x b (b null: against the constant threshold), on the log scale when
// log_scale (every value must then be positive; a value that is not makes the test invalid).
// seeds_a and seeds_b name the seed of each value; when they hold the same seeds the test is
// paired.
ContrastStat test_contrast(const std::vector<double>& a,
                           const std::optional<std::vector<double>>& b,
                           const std::vector<uint64_t>& seeds_a,
                           const std::vector<uint64_t>& seeds_b, double threshold, bool log_scale);

// The smallest |effect| the contrast detects with probability kPower at two-sided level alpha.
double detectable_effect(const ContrastStat& s, double alpha);

// Seeds per side for the observed effect to be detected with probability kPower at level
// alpha; nullopt when the effect is 0 (no number of seeds) or more than kMaxSeedsNeeded would
// be needed.
std::optional<int> seeds_needed(const ContrastStat& s, double alpha);

}  // namespace gradscope
