// Nonlinear conjugate gradient: finite termination on quadratics with an exact line search,
// Rosenbrock's minimum, each beta rule against its formula, restarts and both line searches.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "gradscope/optim/conjugate_gradient.h"
#include "gradscope/optim/factory.h"
#include "test_util.h"

namespace gradscope {
namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kFloat64);

// f(x) = 1/2 x^T A x - b^T x with A = Q diag(lambda) Q^T, lambda log-spaced over [1, kappa].
struct Quadratic {
  torch::Tensor a, b, x_star;
  Quadratic(int64_t n, double kappa, uint64_t seed) {
    torch::manual_seed(seed);
    auto q = std::get<0>(at::linalg_qr(torch::randn({n, n}, kF64)));
    auto lambda = torch::logspace(0, std::log10(kappa), n, 10.0, kF64);
    a = q.mm(torch::diag(lambda)).mm(q.t());
    a = (a + a.t()) / 2;
    b = torch::randn({n}, kF64);
    x_star = at::linalg_solve(a, b);
  }
  torch::Tensor loss(const torch::Tensor& x) const { return 0.5 * x.dot(a.mv(x)) - b.dot(x); }
};

torch::Tensor rosenbrock(const torch::Tensor& x) {
  const int64_t n = x.size(0);
  auto head = x.narrow(0, 0, n - 1), tail = x.narrow(0, 1, n - 1);
  return (100.0 * (tail - head * head).pow(2) + (1.0 - head).pow(2)).sum();
}

// A full-batch closure over one parameter vector.
template <typename F>
torch::optim::Optimizer::LossClosure closure_of(torch::Tensor& x, F f) {
  return [&x, f] {
    x.mutable_grad() = torch::Tensor();
    auto loss = f(x);
    loss.backward();
    return loss.detach();
  };
}

ConjugateGradientOptions exact_search(const std::string& rule) {
  // Tight tolerances: the search finds the exact minimizer along the line, as CG's finite
  // termination assumes (on a quadratic the cubic interpolation is exact).
  return ConjugateGradientOptions(1.0)
      .beta_rule(rule)
      .line_search("strong_wolfe")
      .c1(1e-8)
      .c2(1e-6)
      .max_evals(50)
      .tolerance_change(0);
}

class CgQuadratic : public ::testing::TestWithParam<std::tuple<int64_t, std::string>> {};

// Theory: with exact line searches CG minimizes an n-dimensional quadratic in n iterations.
// The test allows n + 2 (rounding) and asks for the minimizer to 1e-8.
TEST_P(CgQuadratic, ReachesTheMinimumWithinNPlusTwoIterations) {
  const auto [n, rule] = GetParam();
  const Quadratic q(n, 100.0, 11 + n);
  auto x = torch::zeros({n}, kF64).requires_grad_(true);
  ConjugateGradient cg({x}, exact_search(rule));
  auto closure = closure_of(x, [&](const torch::Tensor& v) { return q.loss(v); });
  int64_t iterations = 0;
  double distance = (x.detach() - q.x_star).norm().item<double>();
  while (iterations < n + 2 && distance > 1e-8) {
    cg.step(closure);
    ++iterations;
    distance = (x.detach() - q.x_star).norm().item<double>();
  }
  EXPECT_LE(distance, 1e-8) << rule << " n=" << n << " after " << iterations << " iterations";
  EXPECT_LE(iterations, n + 2);
  std::printf("CG %s n=%lld: |x - x*| = %.2e after %lld iterations\n", rule.c_str(),
              static_cast<long long>(n), distance, static_cast<long long>(iterations));
}

INSTANTIATE_TEST_SUITE_P(Rules, CgQuadratic,
                         ::testing::Combine(::testing::Values(2, 10),
                                            ::testing::Values("fr", "pr+", "hs", "dy")),
                         [](const auto& info) {
                           std::string rule = std::get<1>(info.param);
                           if (rule == "pr+") rule = "prplus";
                           return rule + "_n" + std::to_string(std::get<0>(info.param));
                         });

TEST(CgRosenbrock, StrongWolfeTakesTheStartToTheMinimum) {
  auto x = torch::tensor({-1.2, 1.0}, kF64).requires_grad_(true);
  ConjugateGradient cg({x}, ConjugateGradientOptions(1.0).line_search("strong_wolfe"));
  auto closure = closure_of(x, rosenbrock);
  int64_t steps = 0;
  const auto one = torch::ones({2}, kF64);
  while (steps < 500 && (x.detach() - one).norm().item<double>() > 1e-6) {
    cg.step(closure);
    ++steps;
  }
  const double distance = (x.detach() - one).norm().item<double>();
  EXPECT_LE(distance, 1e-6) << "after " << steps << " steps, x = " << x;
  std::printf(
      "CG pr+ strong Wolfe on Rosenbrock: |x - (1, 1)| = %.2e after %lld steps, %lld "
      "restarts\n",
      distance, static_cast<long long>(steps), static_cast<long long>(cg.restarts()));
}

// f(x) = sum x_i^4 / 4 + x_i^2 / 2 + c.x, not quadratic: the rules give different betas.
torch::Tensor quartic(const torch::Tensor& x) {
  const auto c = torch::tensor({0.3, -0.7, 0.5}, kF64);
  return (x.pow(4) / 4 + x.pow(2) / 2).sum() + c.dot(x);
}
torch::Tensor quartic_grad(const torch::Tensor& x) {
  return x.pow(3) + x + torch::tensor({0.3, -0.7, 0.5}, kF64);
}

// Two fixed steps: the second beta is checked against each rule's formula computed here, and
// the four rules must give four different betas and points (else the test tells them apart
// from nothing).
TEST(CgBetaRules, EachRuleMatchesItsFormulaAndDiffersFromTheOthers) {
  // Chosen so that every rule's direction is a descent direction (no restart) and
  // Polak-Ribiere's beta is positive (pr+ does not clip): betas 0.050, 0.233, 0.197, 0.042.
  const double lr = 0.3;
  const auto x0 = torch::tensor({1.0, -2.0, 0.5}, kF64);
  const auto g0 = quartic_grad(x0);
  const auto d0 = -g0;
  const auto x1 = x0 + lr * d0;
  const auto g1 = quartic_grad(x1);
  const auto y = g1 - g0;
  const double gg = g1.dot(g1).item<double>(), g0g0 = g0.dot(g0).item<double>();
  const double gy = g1.dot(y).item<double>(), dy = d0.dot(y).item<double>();
  const std::map<std::string, double> expected = {
      {"fr", gg / g0g0}, {"pr+", std::max(0.0, gy / g0g0)}, {"hs", gy / dy}, {"dy", gg / dy}};

  std::vector<double> betas;
  std::vector<torch::Tensor> points;
  for (const auto& [rule, beta] : expected) {
    auto x = x0.clone().requires_grad_(true);
    ConjugateGradient cg({x}, ConjugateGradientOptions(lr).beta_rule(rule).line_search("none"));
    auto closure = closure_of(x, quartic);
    cg.step(closure);
    cg.step(closure);
    EXPECT_NEAR(cg.last_beta(), beta, 1e-12 * std::abs(beta)) << rule;
    const auto d1 = -g1 + beta * d0;
    EXPECT_TRUE(torch::allclose(x.detach(), x1 + lr * d1, 1e-12, 1e-14)) << rule;
    EXPECT_EQ(cg.restarts(), 0) << rule;
    betas.push_back(cg.last_beta());
    points.push_back(x.detach().clone());
  }
  for (size_t i = 0; i < betas.size(); ++i)
    for (size_t j = i + 1; j < betas.size(); ++j) {
      EXPECT_GT(std::abs(betas[i] - betas[j]), 1e-3) << "rules " << i << " and " << j;
      EXPECT_FALSE(torch::allclose(points[i], points[j])) << "rules " << i << " and " << j;
    }
}

// Polak-Ribiere's beta is negative when the gradient turns back on itself; pr+ clips it to 0.
TEST(CgBetaRules, PolakRibierePlusClipsNegativeBetaToZero) {
  // f = x^2 / 2 on one coordinate, lr 1.5: g0 = 1, x1 = -0.5, g1 = -0.5, g1.(g1 - g0) = 0.75 > 0;
  // lr 0.5: x1 = 0.5, g1 = 0.5, g1.(g1 - g0) = -0.25 < 0: beta = 0 for pr+, 0.25 for fr.
  for (const auto& [rule, beta] :
       std::vector<std::pair<std::string, double>>{{"pr+", 0.0}, {"fr", 0.25}}) {
    auto x = torch::tensor({1.0}, kF64).requires_grad_(true);
    ConjugateGradient cg({x}, ConjugateGradientOptions(0.5).beta_rule(rule).line_search("none"));
    auto closure = closure_of(x, [](const torch::Tensor& v) { return 0.5 * v.dot(v); });
    cg.step(closure);
    cg.step(closure);
    EXPECT_DOUBLE_EQ(cg.last_beta(), beta) << rule;
  }
}

// On f = x^2 / 2 from 1 with lr 3, the step overshoots to -2; Fletcher-Reeves then gives
// beta 4 and d = 2 - 4 = -2, an ascent direction (g.d = 4): CG must restart with d = -g = 2.
TEST(CgRestart, AnAscentDirectionIsReplacedBySteepestDescent) {
  auto x = torch::tensor({1.0}, kF64).requires_grad_(true);
  ConjugateGradient cg({x}, ConjugateGradientOptions(3.0).beta_rule("fr").line_search("none"));
  auto closure = closure_of(x, [](const torch::Tensor& v) { return 0.5 * v.dot(v); });
  cg.step(closure);
  EXPECT_DOUBLE_EQ(x.item<double>(), -2.0);
  cg.step(closure);
  EXPECT_DOUBLE_EQ(x.item<double>(), 4.0);  // -2 + 3 * 2, not -2 + 3 * (-2)
  EXPECT_EQ(cg.restarts(), 1);
  EXPECT_EQ(cg.last_beta(), 0.0);
}

TEST(CgRestart, RestartsOnScheduleEveryNSteps) {
  auto x = torch::tensor({1.0, -2.0, 0.5}, kF64).requires_grad_(true);
  ConjugateGradient cg(
      {x}, ConjugateGradientOptions(0.1).beta_rule("fr").line_search("none").restart_every(3));
  auto closure = closure_of(x, quartic);
  std::vector<double> betas;
  for (int i = 0; i < 7; ++i) {
    cg.step(closure);
    betas.push_back(cg.last_beta());
  }
  for (int i = 0; i < 7; ++i) {
    if (i % 3 == 0)
      EXPECT_EQ(betas[i], 0.0) << "step " << i + 1;
    else
      EXPECT_GT(betas[i], 0.0) << "step " << i + 1;
  }
  EXPECT_EQ(cg.restarts(), 2);  // steps 4 and 7 (step 1 starts, it does not restart)
}

// Backtracking on f = x^2 / 2 from 1 with lr 4: t = 4 (f = 4.5) and t = 2 (f = 0.5) fail the
// Armijo condition, t = 1 (f = 0) holds: four evaluations (the first is at x itself).
TEST(CgLineSearch, ArmijoBacktracksToTheFirstSufficientDecrease) {
  auto x = torch::tensor({1.0}, kF64).requires_grad_(true);
  ConjugateGradient cg({x}, ConjugateGradientOptions(4.0).line_search("armijo"));
  auto closure = closure_of(x, [](const torch::Tensor& v) { return 0.5 * v.dot(v); });
  cg.step(closure);
  EXPECT_NEAR(x.item<double>(), 0.0, 1e-15);
  EXPECT_EQ(cg.last_evaluations(), 4);
}

// The strong Wolfe step on a quadratic line is its exact minimizer, whichever side of it the
// first trial lands: extrapolation from a short step, zoom from a long one.
TEST(CgLineSearch, StrongWolfeFindsTheExactStepOnAQuadratic) {
  const Quadratic q(5, 30.0, 5);
  for (double first_trial : {1e-3, 0.1, 10.0}) {
    auto x = torch::zeros({5}, kF64).requires_grad_(true);
    ConjugateGradient cg({x}, exact_search("pr+").lr(first_trial));
    auto closure = closure_of(x, [&](const torch::Tensor& v) { return q.loss(v); });
    const auto g0 = -q.b;  // gradient at 0
    cg.step(closure);
    // Exact step along -g0: t* = g0.g0 / g0.A g0.
    const double t_star = (g0.dot(g0) / g0.dot(q.a.mv(g0))).item<double>();
    EXPECT_TRUE(torch::allclose(x.detach(), -t_star * g0, 1e-9, 1e-12))
        << "first trial " << first_trial;
    EXPECT_LE(cg.last_evaluations(), 8) << "first trial " << first_trial;
  }
}

TEST(CgLineSearch, NeedsAClosure) {
  auto x = torch::ones({2}, kF64).requires_grad_(true);
  ConjugateGradient cg({x}, ConjugateGradientOptions(1.0).line_search("strong_wolfe"));
  x.mutable_grad() = torch::ones({2}, kF64);
  EXPECT_THROW(cg.step(), c10::Error);
}

TEST(CgLineSearch, StochasticMiniBatchesLowerALeastSquaresLoss) {
  torch::manual_seed(5);
  const auto data = torch::randn({256, 6});
  const auto w_true = torch::randn({6, 1});
  const auto target = data.mm(w_true) + 0.1 * torch::randn({256, 1});
  auto w = torch::zeros({6, 1}).requires_grad_(true);
  for (const std::string search : {"none", "armijo", "strong_wolfe"}) {
    w.detach().zero_();
    auto optimizer = make_optimizer("cg", {w}, 0.05, 0, {{"line_search", search}});
    auto full = [&] { return (data.mm(w) - target).pow(2).mean().item<double>(); };
    const double before = full();
    for (int step = 0; step < 64; ++step) {
      const auto rows = torch::arange(step % 8 * 32, step % 8 * 32 + 32);
      optimizer->step([&] {
        w.mutable_grad() = torch::Tensor();
        auto loss = (data.index_select(0, rows).mm(w) - target.index_select(0, rows)).pow(2).mean();
        loss.backward();
        return loss.detach();
      });
    }
    EXPECT_LT(full(), 0.1 * before) << search;
  }
}

// ----------------------------------------------------------- weight decay in the search

// With weight decay the search minimizes F(x) = q(x) + wd / 2 x.x, whose gradient
// A x - b + wd x CG follows; the test restates both in float64.
struct DecayedQuadratic {
  Quadratic q;
  double wd;
  double value(const torch::Tensor& x) const {
    return q.loss(x).item<double>() + 0.5 * wd * x.dot(x).item<double>();
  }
  double loss_only(const torch::Tensor& x) const { return q.loss(x).item<double>(); }
  torch::Tensor grad(const torch::Tensor& x) const { return q.a.mv(x) - q.b + wd * x; }
};

// Armijo backtracking restated on F: the first t = lr b^k with
// F(x0 + t d) <= F(x0) + c1 t grad F(x0).d. CG must take that step with that many
// evaluations; a search that read the closure's loss without the decay term stops at
// another t (the test checks that it does, so it can tell the two apart).
TEST(CgWeightDecay, ArmijoSearchesTheRegularizedObjective) {
  // A strong decay (its curvature 20 against the loss's 1 to 10) puts the two objectives'
  // Armijo bounds on t more than a factor 2 apart, so halving from lr cannot meet both. The
  // problem is written out (a diagonal quadratic): on a random one the two searches may stop
  // at the same t, and the check below would then prove nothing.
  DecayedQuadratic f{Quadratic(4, 10.0, 3), 20.0};
  f.q.a = torch::diag(torch::tensor({1.0, 2.0, 5.0, 10.0}, kF64));
  f.q.b = torch::tensor({1.0, -1.0, 0.5, 2.0}, kF64);
  const double lr = 2.0, c1 = 0.3, backtrack = 0.5;
  const auto x0 = torch::tensor({0.1, -0.2, 0.05, 0.3}, kF64);
  const auto d = -f.grad(x0);
  const double slope = -d.dot(d).item<double>();
  auto armijo = [&](const std::function<double(const torch::Tensor&)>& value) {
    double t = lr;
    for (int64_t evals = 2; evals <= 26; ++evals, t *= backtrack)
      if (value(x0 + t * d) <= value(x0) + c1 * t * slope) return std::make_pair(t, evals);
    return std::make_pair(0.0, int64_t{26});
  };
  const auto [t, evals] = armijo([&](const torch::Tensor& x) { return f.value(x); });
  const auto [t_loss_only, unused] = armijo([&](const torch::Tensor& x) { return f.loss_only(x); });
  ASSERT_GT(t, 0.0);
  ASSERT_NE(t, t_loss_only) << "the problem cannot tell the objectives apart";

  auto x = x0.clone().requires_grad_(true);
  ConjugateGradient cg({x}, ConjugateGradientOptions(lr)
                                .line_search("armijo")
                                .c1(c1)
                                .c2(0.9)
                                .backtrack(backtrack)
                                .weight_decay(f.wd));
  cg.step(closure_of(x, [&](const torch::Tensor& v) { return f.q.loss(v); }));
  const double taken = (x.detach() - x0).dot(d).item<double>() / d.dot(d).item<double>();
  EXPECT_TRUE(torch::allclose(x.detach(), x0 + t * d, 1e-12, 1e-14))
      << "step taken " << taken << ", Armijo on f + wd/2 |x|^2 takes " << t
      << ", on the loss alone " << t_loss_only;
  EXPECT_EQ(cg.last_evaluations(), evals);
}

// A first trial at 1.9 t* (t* the exact minimizer of F along d) meets the curvature condition
// for c2 = 0.95 but not sufficient decrease for c1 = 0.1 (F falls by 0.095 |slope| t*, less than
// the 0.19 asked for). From x0 = 0 the decay term grows along the line, so the loss alone
// looks low enough there: a search that left it out would accept the trial. The accepted step
// must hold both strong-Wolfe conditions on F, checked here in float64.
TEST(CgWeightDecay, StrongWolfeStepHoldsTheConditionsOfTheRegularizedObjective) {
  const DecayedQuadratic f{Quadratic(5, 10.0, 8), 2.0};
  const double c1 = 0.1, c2 = 0.95;
  const auto x0 = torch::zeros({5}, kF64);
  const auto g0 = f.grad(x0);
  const auto d = -g0;
  const double slope = g0.dot(d).item<double>();
  const double t_star = -slope / d.dot(f.q.a.mv(d) + f.wd * d).item<double>();

  auto x = x0.clone().requires_grad_(true);
  ConjugateGradient cg({x}, ConjugateGradientOptions(1.9 * t_star)
                                .line_search("strong_wolfe")
                                .c1(c1)
                                .c2(c2)
                                .weight_decay(f.wd));
  cg.step(closure_of(x, [&](const torch::Tensor& v) { return f.q.loss(v); }));
  const auto x1 = x.detach();
  const double t = (x1 - x0).dot(d).item<double>() / d.dot(d).item<double>();
  EXPECT_TRUE(torch::allclose(x1, x0 + t * d, 1e-12, 1e-14)) << "the step left the line";
  EXPECT_GT(t, 0.0);
  EXPECT_LE(f.value(x1), f.value(x0) + c1 * t * slope)
      << "sufficient decrease fails on f + wd/2 |x|^2 at t = " << t << " (t* = " << t_star << ")";
  EXPECT_LE(std::abs(f.grad(x1).dot(d).item<double>()), c2 * std::abs(slope))
      << "curvature fails at t = " << t;
  std::printf("CG strong Wolfe with weight decay: t = %.4f t*, %lld evaluations\n", t / t_star,
              static_cast<long long>(cg.last_evaluations()));
}

TEST(CgSettings, BadValuesAreRefusedByName) {
  auto refusal = [](const OptSettings& opt) {
    const Error e = testing::expect_usage_error(
        [&] { make_optimizer("cg", {torch::ones({2}, torch::requires_grad())}, 0.1, 0, opt); });
    return std::string(e.what()) + " | " + e.hint();
  };
  EXPECT_NE(refusal({{"beta_rule", "pr"}}).find("'pr'"), std::string::npos);
  EXPECT_NE(refusal({{"beta_rule", "pr"}}).find("fr, pr+, hs, dy"), std::string::npos);
  EXPECT_NE(refusal({{"line_search", "wolfe"}}).find("'wolfe'"), std::string::npos);
  EXPECT_NE(refusal({{"c1", "0.5"}, {"c2", "0.1"}}).find("c1=0.5"), std::string::npos);
  EXPECT_NE(refusal({{"restart_every", "-1"}}).find("restart_every=-1"), std::string::npos);
  EXPECT_NE(refusal({{"restart_every", "2.5"}}).find("restart_every=2.5"), std::string::npos);
  EXPECT_NE(refusal({{"backtrack", "1"}}).find("backtrack=1"), std::string::npos);
  EXPECT_NE(refusal({{"max_evals", "0"}}).find("max_evals=0"), std::string::npos);
}

}  // namespace
}  // namespace gradscope
