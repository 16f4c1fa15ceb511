// Lion, Adafactor and Adadelta against updates computed here, element by element in plain
// doubles, straight from the formulas in their headers: two steps on a 2x3 matrix and a
// 3-vector with fixed gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "gradscope/optim/adadelta.h"
#include "gradscope/optim/adafactor.h"
#include "gradscope/optim/lion.h"

namespace gradscope {
namespace {

using Values = std::vector<double>;

constexpr int kRows = 2, kCols = 3;
// Parameters: W (2, 3) and b (3). Gradients for step 1 and 2; the zeros check sign(0) = 0,
// and G2's small entries of the opposite sign check that Lion's sign follows the
// interpolation with the momentum, not the gradient.
const Values kW0 = {0.5, -1.0, 2.0, 0.25, -0.75, 1.5};
const Values kB0 = {0.1, -0.2, 0.3};
const Values kGW1 = {1.0, -2.0, 3.0, 0.5, 0.0, -1.5};
const Values kGB1 = {0.2, -0.4, 0.0};
const Values kGW2 = {-0.05, 1.0, -0.01, 0.3, 0.7, 0.02};
const Values kGB2 = {-0.01, 0.5, 0.3};

torch::Tensor tensor(const Values& v, std::vector<int64_t> shape) {
  return torch::tensor(v, torch::kFloat64).reshape(shape).clone();
}

Values values(const torch::Tensor& t) {
  auto c = t.detach().contiguous();
  return Values(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

void expect_near_all(const Values& got, const Values& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-12 * (1 + std::abs(want[i]))) << what << "[" << i << "]";
}

// Runs two steps with the fixed gradients and returns (W, b) after each.
std::vector<std::pair<Values, Values>> run_two_steps(
    const std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>&
        make) {
  auto w = tensor(kW0, {kRows, kCols}).requires_grad_(true);
  auto b = tensor(kB0, {kCols}).requires_grad_(true);
  auto optimizer = make({w, b});
  std::vector<std::pair<Values, Values>> out;
  for (const auto& [gw, gb] : {std::make_pair(kGW1, kGB1), std::make_pair(kGW2, kGB2)}) {
    w.mutable_grad() = tensor(gw, {kRows, kCols});
    b.mutable_grad() = tensor(gb, {kCols});
    optimizer->step();
    out.emplace_back(values(w), values(b));
  }
  return out;
}

double sign(double v) { return v > 0 ? 1.0 : (v < 0 ? -1.0 : 0.0); }

// ----------------------------------------------------------------------------- Lion

void lion_reference(Values& x, Values& m, const Values& g, double lr, double beta1, double beta2,
                    double wd) {
  for (size_t i = 0; i < x.size(); ++i) {
    const double c = beta1 * m[i] + (1 - beta1) * g[i];
    x[i] = x[i] - lr * (sign(c) + wd * x[i]);
    m[i] = beta2 * m[i] + (1 - beta2) * g[i];
  }
}

TEST(LionOptim, TwoStepsMatchTheFormula) {
  const double lr = 0.1, beta1 = 0.9, beta2 = 0.99, wd = 0.1;
  const auto got = run_two_steps([&](std::vector<torch::Tensor> params) {
    return std::make_unique<Lion>(
        std::move(params), LionOptions(lr).betas(std::make_tuple(beta1, beta2)).weight_decay(wd));
  });
  Values w = kW0, b = kB0, mw(6, 0.0), mb(3, 0.0);
  lion_reference(w, mw, kGW1, lr, beta1, beta2, wd);
  lion_reference(b, mb, kGB1, lr, beta1, beta2, wd);
  expect_near_all(got[0].first, w, "W step 1");
  expect_near_all(got[0].second, b, "b step 1");
  lion_reference(w, mw, kGW2, lr, beta1, beta2, wd);
  lion_reference(b, mb, kGB2, lr, beta1, beta2, wd);
  expect_near_all(got[1].first, w, "W step 2");
  expect_near_all(got[1].second, b, "b step 2");
  // Step 2, W[0][0]: the gradient is -0.05 but 0.9 * 0.01 * 1.0 - 0.1 * 0.05 > 0, so the
  // coordinate keeps moving down: (W after step 1) * (1 - lr wd) - lr.
  EXPECT_NEAR(got[1].first[0], got[0].first[0] * (1 - lr * wd) - lr, 1e-15);
}

TEST(LionOptim, RefusesBadBetasNamingTheValue) {
  auto p = std::vector<torch::Tensor>{torch::zeros({3}, torch::requires_grad())};
  try {
    Lion(p, LionOptions().betas(std::make_tuple(0.9, 1.25)));
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("1.25"), std::string::npos) << e.what();
  }
}

// ------------------------------------------------------------------------ Adafactor

struct AdafactorRef {
  double lr = 1e-2, eps1 = 1e-30, eps2 = 1e-3, clip = 1.0, decay_rate = -0.8, wd = 0;
  std::optional<double> beta1;
  bool scale_parameter = true, relative_step = true;
};

double rms(const Values& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s / v.size());
}

// One step on x of shape (rows, cols), or a vector when rows == 0. The state vectors start
// empty and are sized on the first call.
void adafactor_reference(Values& x, const Values& g, int rows, int cols, int t,
                         const AdafactorRef& o, Values& r, Values& c, Values& v, Values& m) {
  const size_t n = x.size();
  double rho = o.lr;
  if (o.relative_step) rho = std::min(o.lr, 1.0 / std::sqrt(t));
  const double alpha = o.scale_parameter ? std::max(o.eps2, rms(x)) * rho : rho;
  const double beta2 = 1.0 - std::pow(t, o.decay_rate);
  Values u(n);
  if (rows > 0) {
    if (r.empty()) r.assign(rows, 0.0), c.assign(cols, 0.0);
    for (int i = 0; i < rows; ++i) {
      double mean = 0;
      for (int j = 0; j < cols; ++j) mean += (g[i * cols + j] * g[i * cols + j] + o.eps1) / cols;
      r[i] = beta2 * r[i] + (1 - beta2) * mean;
    }
    for (int j = 0; j < cols; ++j) {
      double mean = 0;
      for (int i = 0; i < rows; ++i) mean += (g[i * cols + j] * g[i * cols + j] + o.eps1) / rows;
      c[j] = beta2 * c[j] + (1 - beta2) * mean;
    }
    double r_mean = 0;
    for (double ri : r) r_mean += ri / rows;
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < cols; ++j)
        u[i * cols + j] = g[i * cols + j] / std::sqrt(r[i] / r_mean * c[j]);
  } else {
    if (v.empty()) v.assign(n, 0.0);
    for (size_t i = 0; i < n; ++i) {
      v[i] = beta2 * v[i] + (1 - beta2) * (g[i] * g[i] + o.eps1);
      u[i] = g[i] / std::sqrt(v[i]);
    }
  }
  const double clip = std::max(1.0, rms(u) / o.clip);
  for (auto& ui : u) ui = ui / clip * alpha;
  if (o.beta1) {
    if (m.empty()) m.assign(n, 0.0);
    for (size_t i = 0; i < n; ++i) u[i] = m[i] = *o.beta1 * m[i] + (1 - *o.beta1) * u[i];
  }
  for (size_t i = 0; i < n; ++i) x[i] = x[i] - o.wd * alpha * x[i] - u[i];
}

void check_adafactor(const AdafactorRef& o) {
  const auto got = run_two_steps([&](std::vector<torch::Tensor> params) {
    auto options = AdafactorOptions(o.lr)
                       .eps1(o.eps1)
                       .eps2(o.eps2)
                       .clip_threshold(o.clip)
                       .decay_rate(o.decay_rate)
                       .beta1(o.beta1 ? c10::optional<double>(*o.beta1) : c10::nullopt)
                       .weight_decay(o.wd)
                       .scale_parameter(o.scale_parameter)
                       .relative_step(o.relative_step);
    return std::make_unique<Adafactor>(std::move(params), options);
  });
  Values w = kW0, b = kB0, wr, wc, wv, wm, br, bc, bv, bm;
  adafactor_reference(w, kGW1, kRows, kCols, 1, o, wr, wc, wv, wm);
  adafactor_reference(b, kGB1, 0, 0, 1, o, br, bc, bv, bm);
  expect_near_all(got[0].first, w, "W step 1");
  expect_near_all(got[0].second, b, "b step 1");
  adafactor_reference(w, kGW2, kRows, kCols, 2, o, wr, wc, wv, wm);
  adafactor_reference(b, kGB2, 0, 0, 2, o, br, bc, bv, bm);
  expect_near_all(got[1].first, w, "W step 2");
  expect_near_all(got[1].second, b, "b step 2");
}

TEST(AdafactorOptim, TwoStepsMatchTheFormulaWithDefaults) {
  // Relative step min(1e-2, 1/sqrt(t)) scaled by RMS(X), no first moment.
  check_adafactor(AdafactorRef{});
}

TEST(AdafactorOptim, TwoStepsMatchTheFormulaWithFirstMomentClippingAndDecay) {
  AdafactorRef o;
  o.lr = 0.05;
  o.relative_step = false;
  o.scale_parameter = false;
  o.clip = 0.5;  // below RMS(U) here, so the clipping acts
  o.beta1 = 0.9;
  o.wd = 0.1;
  check_adafactor(o);
}

TEST(AdafactorOptim, FactorsOverTheLastTwoDims) {
  auto p = torch::zeros({4, 5, 6}, torch::requires_grad());  // (batch, rows, cols)
  Adafactor optimizer({p});
  p.mutable_grad() = torch::randn({4, 5, 6});
  optimizer.step();
  const auto& state = static_cast<const AdafactorParamState&>(*optimizer.state().begin()->second);
  EXPECT_EQ(state.exp_avg_sq_row().sizes(), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(state.exp_avg_sq_col().sizes(), (std::vector<int64_t>{4, 6}));
  EXPECT_FALSE(state.exp_avg_sq().defined());
  EXPECT_FALSE(state.exp_avg().defined());
  EXPECT_TRUE(p.isfinite().all().item<bool>());
}

// ------------------------------------------------------------------------- Adadelta

void adadelta_reference(Values& x, Values& sq, Values& acc, const Values& g, double lr, double rho,
                        double eps, double wd) {
  if (sq.empty()) sq.assign(x.size(), 0.0), acc.assign(x.size(), 0.0);
  for (size_t i = 0; i < x.size(); ++i) {
    const double gi = g[i] + wd * x[i];
    sq[i] = rho * sq[i] + (1 - rho) * gi * gi;
    const double dx = std::sqrt(acc[i] + eps) / std::sqrt(sq[i] + eps) * gi;
    acc[i] = rho * acc[i] + (1 - rho) * dx * dx;
    x[i] -= lr * dx;
  }
}

TEST(AdadeltaOptim, TwoStepsMatchTheFormula) {
  const double lr = 0.5, rho = 0.8, eps = 1e-3, wd = 0.05;
  const auto got = run_two_steps([&](std::vector<torch::Tensor> params) {
    return std::make_unique<Adadelta>(std::move(params),
                                      AdadeltaOptions(lr).rho(rho).eps(eps).weight_decay(wd));
  });
  Values w = kW0, b = kB0, wsq, wacc, bsq, bacc;
  adadelta_reference(w, wsq, wacc, kGW1, lr, rho, eps, wd);
  adadelta_reference(b, bsq, bacc, kGB1, lr, rho, eps, wd);
  expect_near_all(got[0].first, w, "W step 1");
  expect_near_all(got[0].second, b, "b step 1");
  adadelta_reference(w, wsq, wacc, kGW2, lr, rho, eps, wd);
  adadelta_reference(b, bsq, bacc, kGB2, lr, rho, eps, wd);
  expect_near_all(got[1].first, w, "W step 2");
  expect_near_all(got[1].second, b, "b step 2");
}

TEST(AdadeltaOptim, MaximizeClimbs) {
  // Maximizing f is minimizing -f: the same run with negated gradients.
  auto up = run_two_steps([](std::vector<torch::Tensor> params) {
    return std::make_unique<Adadelta>(std::move(params), AdadeltaOptions().maximize(true));
  });
  Values w = kW0, b = kB0, wsq, wacc, bsq, bacc, gw = kGW1, gb = kGB1;
  for (auto& v : gw) v = -v;
  for (auto& v : gb) v = -v;
  adadelta_reference(w, wsq, wacc, gw, 1.0, 0.9, 1e-6, 0);
  adadelta_reference(b, bsq, bacc, gb, 1.0, 0.9, 1e-6, 0);
  expect_near_all(up[0].first, w, "W step 1");
  expect_near_all(up[0].second, b, "b step 1");
}

}  // namespace
}  // namespace gradscope
