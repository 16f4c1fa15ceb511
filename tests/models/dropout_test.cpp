// dropout() of models/common/layers.h on the CPU: the fraction it drops, the scale of what it
// keeps, its gradient against finite differences, and the mask as a function of the default
// generator's state alone (not of the number of threads).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "gradscope/models/common/layers.h"

namespace gradscope {
namespace {

// A handle on the default CPU generator, whose state decides the masks.
at::Generator cpu_generator() { return at::detail::getDefaultCPUGenerator(); }

// The mask a dropout call drew: where the output is zero (the input has no zeros).
torch::Tensor dropped(const torch::Tensor& y) { return y.eq(0); }

TEST(Dropout, DropsTheFractionPWithinFiveStandardErrors) {
  torch::manual_seed(3);
  const int64_t n = 1 << 20;
  for (double p : {0.01, 0.1, 0.5, 0.9}) {
    const auto x = torch::rand({n}) + 1;  // no zeros
    const double share = dropped(dropout(x, p)).to(torch::kDouble).mean().item<double>();
    const double se = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(share, p, 5 * se) << "p=" << p;
  }
}

TEST(Dropout, KeepsTheRestScaledByOneOverOneMinusP) {
  torch::manual_seed(4);
  for (auto dtype : {torch::kFloat32, torch::kFloat64, torch::kBFloat16}) {
    const auto x = (torch::rand({4, 33, 17}) + 1).to(dtype);  // odd sizes: a pair split
    const auto y = dropout(x, 0.25);
    ASSERT_EQ(y.scalar_type(), dtype);
    const auto kept = y.ne(0);
    // x times 1 / (1 - p), in float for the 16-bit dtypes (and rounded back), as ATen computes
    // element-wise products.
    const auto opmath = dtype == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
    const auto expected = (x.to(opmath) * (1.0 / 0.75)).to(dtype);
    EXPECT_TRUE(torch::equal(y.masked_select(kept), expected.masked_select(kept)))
        << torch::toString(dtype);
  }
}

TEST(Dropout, ZeroReturnsTheInputAndOneDropsEverything) {
  const auto x = torch::rand({10}) + 1;
  EXPECT_TRUE(dropout(x, 0.0).is_same(x));
  EXPECT_TRUE(torch::equal(dropout(x, 1.0), torch::zeros_like(x)));
  EXPECT_THROW(dropout(x, 1.5), c10::Error);
  EXPECT_THROW(dropout(x, -0.1), c10::Error);
}

TEST(Dropout, GradientMatchesFiniteDifferencesUnderTheSameMask) {
  // The function is linear in x under a fixed mask, so a central difference is exact up to
  // rounding: each draw restores the generator's state, as a recomputing strategy does.
  torch::manual_seed(5);
  auto x = torch::randn({6, 7}, torch::kFloat64).requires_grad_(true);
  const auto w = torch::randn({6, 7}, torch::kFloat64);
  const auto state = cpu_generator().get_state();
  auto f = [&](const torch::Tensor& in) {
    cpu_generator().set_state(state);
    return (dropout(in, 0.3) * w).sum();
  };
  f(x).backward();
  const auto grad = x.grad().clone();
  const double h = 1e-6;
  torch::NoGradGuard no_grad;
  for (int64_t i = 0; i < x.numel(); ++i) {
    auto plus = x.detach().clone(), minus = x.detach().clone();
    plus.view(-1)[i] += h;
    minus.view(-1)[i] -= h;
    const double numeric = (f(plus).item<double>() - f(minus).item<double>()) / (2 * h);
    EXPECT_NEAR(grad.view(-1)[i].item<double>(), numeric, 1e-8) << "element " << i;
  }
  // And exactly: w / (1 - p) where kept, 0 where dropped (the mask read off a ones input).
  cpu_generator().set_state(state);
  const auto scale_or_zero = dropout(torch::ones_like(x), 0.3);
  EXPECT_TRUE(torch::allclose(grad, w * scale_or_zero, 0, 1e-15));
}

TEST(Dropout, TheGeneratorStateAloneDecidesTheMask) {
  // 65,538 elements: split evenly between 2 threads, the second task would start at an odd
  // element, inside a pair that shares one draw (TheMaskOfARangeIsThatOfTheWhole tests such
  // ranges directly).
  const auto x = torch::rand({2, 32769}) + 1;
  torch::manual_seed(6);
  const auto state = cpu_generator().get_state();
  const int threads = torch::get_num_threads();
  torch::set_num_threads(2);
  const auto first = dropped(dropout(x, 0.2));
  const auto second = dropped(dropout(x, 0.2));
  EXPECT_FALSE(torch::equal(first, second)) << "each call must draw a new mask";
  cpu_generator().set_state(state);
  torch::set_num_threads(1);
  const auto again = dropped(dropout(x, 0.2));
  torch::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(first, again));
  // A transposed (non-contiguous) input is dropped as its contiguous copy would be.
  cpu_generator().set_state(state);
  const auto t = dropout(x.t(), 0.2);
  cpu_generator().set_state(state);
  EXPECT_TRUE(torch::equal(t, dropout(x.t().contiguous(), 0.2)));
}

TEST(Dropout, TheMaskOfARangeIsThatOfTheWhole) {
  // However a parallel backend splits the elements, at odd or even points, each element gets
  // the bits it gets when one thread draws them all.
  const int64_t n = 1001;
  const uint32_t threshold = 3000000000u;
  std::vector<char> whole(n), parts(n);
  dropout_keep_mask(42, threshold, reinterpret_cast<bool*>(whole.data()), 0, n);
  const std::vector<int64_t> cuts = {0, 1, 2, 7, 8, 333, 334, 335, 999, n};
  for (size_t c = 0; c + 1 < cuts.size(); ++c)
    dropout_keep_mask(42, threshold, reinterpret_cast<bool*>(parts.data()), cuts[c],
                      cuts[c + 1]);
  EXPECT_EQ(whole, parts);
  EXPECT_GT(std::count(whole.begin(), whole.end(), 1), 0);
  EXPECT_GT(std::count(whole.begin(), whole.end(), 0), 0);
}

TEST(Dropout, NeighbouringElementsAreIndependent) {
  // Elements 2j and 2j + 1 share one 64-bit draw; their masks must still be independent:
  // both dropped about p^2 of the time.
  torch::manual_seed(7);
  const int64_t n = 1 << 20;
  const double p = 0.3;
  const auto d = dropped(dropout(torch::rand({n}) + 1, p)).view({n / 2, 2});
  const double both = d.all(1).to(torch::kDouble).mean().item<double>();
  EXPECT_NEAR(both, p * p, 5 * std::sqrt(p * p * (1 - p * p) / (n / 2)));
}

}  // namespace
}  // namespace gradscope
