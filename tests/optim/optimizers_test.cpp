// Every registered optimizer: state bytes, serialization round trip, refusal of bad settings.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include "gradscope/core/error.h"
#include "gradscope/core/tensors.h"
#include "gradscope/optim/adadelta.h"
#include "gradscope/optim/adafactor.h"
#include "gradscope/optim/factory.h"
#include "gradscope/optim/lion.h"
#include "gradscope/optim/state_bytes.h"
#include "test_util.h"

namespace gradscope {
namespace {

// (64, 32) matrix, (32) vector and (4, 5, 6) tensor, float32.
std::vector<torch::Tensor> float_params() {
  return {torch::randn({64, 32}).requires_grad_(true), torch::randn({32}).requires_grad_(true),
          torch::randn({4, 5, 6}).requires_grad_(true)};
}

// A matrix and a vector named as a block's MLP weight and bias (the names only matter to
// galore, which projects such a matrix).
const std::vector<std::string> kMatrixAndBias = {"layers.0.mlp.fc1.weight",
                                                 "layers.0.mlp.fc1.bias"};

int64_t params_bytes(const std::vector<torch::Tensor>& params) { return tensors_bytes(params); }

// One step with random gradients, so the lazy state exists.
void step_once(torch::optim::Optimizer& optimizer, const std::vector<torch::Tensor>& params) {
  for (const auto& p : params) p.mutable_grad() = torch::randn_like(p);
  optimizer.step();
}

TEST(OptimizerStateBytes, AdadeltaHoldsTwiceTheParameters) {
  auto params = float_params();
  auto optimizer = make_optimizer("adadelta", params, 1.0, 0, {});
  EXPECT_EQ(optimizer_state_bytes(*optimizer), 0);  // lazy: nothing before the first step
  step_once(*optimizer, params);
  EXPECT_EQ(optimizer_state_bytes(*optimizer), 2 * params_bytes(params));
}

TEST(OptimizerStateBytes, LionHoldsOnceTheParameters) {
  auto params = float_params();
  auto optimizer = make_optimizer("lion", params, 1e-4, 0.1, {});
  step_once(*optimizer, params);
  EXPECT_EQ(optimizer_state_bytes(*optimizer), params_bytes(params));
}

TEST(OptimizerStateBytes, AdafactorHoldsRowsPlusColumnsPerMatrix) {
  auto params = float_params();
  auto optimizer = make_optimizer("adafactor", params, 1e-2, 0, {});
  step_once(*optimizer, params);
  const int64_t matrix = (64 + 32) * 4;
  const int64_t vector = 32 * 4;            // unfactored: the vector's size
  const int64_t batched = 4 * (5 + 6) * 4;  // the last two dims factored, per leading index
  EXPECT_EQ(optimizer_state_bytes(*optimizer), matrix + vector + batched);

  auto with_beta1 = make_optimizer("adafactor", params, 1e-2, 0, {{"beta1", "0.9"}});
  step_once(*with_beta1, params);
  EXPECT_EQ(optimizer_state_bytes(*with_beta1), matrix + vector + batched + params_bytes(params));
}

TEST(OptimizerStateBytes, AdamWHoldsTwiceTheParameters) {
  auto params = float_params();
  auto optimizer = make_optimizer("adamw", params, 1e-3, 0.01, {});
  step_once(*optimizer, params);
  EXPECT_EQ(optimizer_state_bytes(*optimizer), 2 * params_bytes(params));
}

// Settings that give each optimizer some state to lose (SGD has none without momentum).
OptSettings stateful_settings(const std::string& name) {
  if (name == "sgd") return {{"momentum", "0.9"}};
  if (name == "adafactor") return {{"beta1", "0.9"}};
  if (name == "adam" || name == "adamw") return {{"amsgrad", "true"}};
  // The gradients here come from no function a line search could evaluate: a fixed step.
  if (name == "cg") return {{"line_search", "none"}};
  return {};
}

// A registry name as a test name: GoogleTest's names take letters, digits and '_' only.
std::string test_name_of(std::string name) {
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

class OptimizerSerialization : public ::testing::TestWithParam<std::string> {};

// Saves an optimizer after three steps, loads it into a fresh one over copies of the
// parameters, then steps both twice with the same gradients: the parameters must be equal
// bit for bit, and differ from an optimizer that lost its state.
TEST_P(OptimizerSerialization, RoundTripContinuesExactly) {
  const std::string name = GetParam();
  const auto& entry = optimizer_registry().get(name);
  const auto settings = stateful_settings(name);
  torch::manual_seed(7);
  std::vector<torch::Tensor> a = {torch::randn({2, 3}, torch::kFloat64).requires_grad_(true),
                                  torch::randn({3}, torch::kFloat64).requires_grad_(true)};
  auto original = make_optimizer(name, a, kMatrixAndBias, entry.default_lr, 0.01, settings);
  std::vector<std::vector<torch::Tensor>> grads;
  for (int i = 0; i < 5; ++i) {
    grads.push_back({torch::randn({2, 3}, torch::kFloat64), torch::randn({3}, torch::kFloat64)});
  }
  auto step = [&](torch::optim::Optimizer& optimizer, std::vector<torch::Tensor>& params, int i) {
    for (size_t k = 0; k < params.size(); ++k) params[k].mutable_grad() = grads[i][k].clone();
    optimizer.step();
  };
  for (int i = 0; i < 3; ++i) step(*original, a, i);

  std::stringstream buffer;
  torch::save(*original, buffer);
  auto copy = [&] {
    std::vector<torch::Tensor> out;
    for (const auto& p : a) out.push_back(p.detach().clone().requires_grad_(true));
    return out;
  };
  auto b = copy();
  auto c = copy();
  auto loaded = make_optimizer(name, b, kMatrixAndBias, entry.default_lr, 0.01, settings);
  torch::load(*loaded, buffer);
  auto forgetful = make_optimizer(name, c, kMatrixAndBias, entry.default_lr, 0.01, settings);
  EXPECT_EQ(optimizer_state_bytes(*loaded), optimizer_state_bytes(*original));

  for (int i = 3; i < 5; ++i) {
    step(*original, a, i);
    step(*loaded, b, i);
    step(*forgetful, c, i);
  }
  bool any_differs = false;
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_TRUE(torch::equal(a[k], b[k])) << name << " parameter " << k << " after loading";
    any_differs = any_differs || !torch::equal(a[k], c[k]);
  }
  EXPECT_TRUE(any_differs) << name << ": losing the state changed nothing, so the test proves "
                           << "nothing";
}

INSTANTIATE_TEST_SUITE_P(Registered, OptimizerSerialization,
                         ::testing::ValuesIn(optimizer_registry().names()),
                         [](const auto& info) { return test_name_of(info.param); });

class OptimizerDescent : public ::testing::TestWithParam<std::string> {};

// With its default learning rate, every optimizer lowers a float32 least-squares loss,
// ||X W - Y||^2 / n, over 300 steps.
TEST_P(OptimizerDescent, LowersALeastSquaresLoss) {
  torch::manual_seed(3);
  const auto x = torch::randn({64, 8});  // (n, in)
  const auto y = torch::randn({64, 4});  // (n, out)
  auto w = torch::randn({8, 4}).requires_grad_(true);
  auto b = torch::zeros({4}).requires_grad_(true);
  const auto& entry = optimizer_registry().get(GetParam());
  auto optimizer = make_optimizer(GetParam(), {w, b}, kMatrixAndBias, entry.default_lr, 0, {});
  auto loss_fn = [&] { return (torch::addmm(b, x, w) - y).pow(2).mean(); };
  const double before = loss_fn().item<double>();
  for (int i = 0; i < 300; ++i) {
    if (entry.steps_with_closure) {  // it evaluates the loss itself (a line search)
      optimizer->step([&] {
        optimizer->zero_grad();
        auto loss = loss_fn();
        loss.backward();
        return loss.detach();
      });
      continue;
    }
    optimizer->zero_grad();
    loss_fn().backward();
    optimizer->step();
  }
  const double after = loss_fn().item<double>();
  EXPECT_LT(after, 0.99 * before) << GetParam() << " from " << before << " to " << after;
  EXPECT_TRUE(w.isfinite().all().item<bool>());
}

INSTANTIATE_TEST_SUITE_P(Registered, OptimizerDescent,
                         ::testing::ValuesIn(optimizer_registry().names()),
                         [](const auto& info) { return test_name_of(info.param); });

std::vector<torch::Tensor> fresh_param() { return {torch::ones({3}, torch::requires_grad())}; }

// The usage error's message and hint, for a call that must be refused.
std::string refusal(const std::string& name, double lr, const OptSettings& opt,
                    double weight_decay = 0) {
  const Error e = testing::expect_usage_error(
      [&] { make_optimizer(name, fresh_param(), lr, weight_decay, opt); });
  return std::string(e.what()) + " | " + e.hint();
}

struct BadSetting {
  std::string optimizer;
  double lr;
  OptSettings opt;
  std::string named;  // what the message must contain
};

TEST(OptimizerSettings, RefusesBadValuesNamingThem) {
  const std::vector<BadSetting> cases = {
      {"adadelta", 1.0, {{"rho", "1.5"}}, "rho=1.5"},
      {"adadelta", 1.0, {{"rho", "-0.1"}}, "rho=-0.1"},
      {"adadelta", 1.0, {{"eps", "-1e-06"}}, "eps=-1e-06"},
      {"adadelta", -2.0, {}, "-2"},
      {"adadelta", 1.0, {{"maximize", "maybe"}}, "maximize=maybe"},
      {"adamw", 1e-3, {{"betas", "1.2,0.999"}}, "betas=1.2,0.999"},
      {"adamw", 1e-3, {{"eps", "-1"}}, "eps=-1"},
      {"lion", 1e-4, {{"betas", "0.9,1"}}, "betas=0.9,1"},
      {"lion", 1e-4, {{"betas", "-0.1,0.99"}}, "betas=-0.1,0.99"},
      {"lion", -0.5, {}, "-0.5"},
      {"adafactor", 1e-2, {{"decay_rate", "0.5"}}, "decay_rate=0.5"},
      {"adafactor", 1e-2, {{"clip_threshold", "0"}}, "clip_threshold=0"},
      {"adafactor", 1e-2, {{"beta1", "1"}}, "beta1=1"},
      {"adafactor", 1e-2, {{"eps", "-1e-30,0.001"}}, "eps=-1e-30,0.001"},
      {"adafactor", 1e-2, {{"warmup_init", "true"}, {"relative_step", "false"}}, "warmup_init"},
      {"adafactor", 1e-2, {{"betas", "0.9,0.99"}}, "beta1, decay_rate, clip_threshold"},
  };
  for (const auto& c : cases) {
    const auto msg = refusal(c.optimizer, c.lr, c.opt);
    EXPECT_TRUE(testing::contains(msg, c.named))
        << c.optimizer << ": '" << msg << "' does not name '" << c.named << "'";
  }
  EXPECT_NE(refusal("lion", 1e-4, {}, -0.1).find("-0.1"), std::string::npos);
}

TEST(OptimizerSettings, ConstructorsRefuseBadValuesNamingThem) {
  auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const c10::Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected a c10::Error";
    return "";
  };
  EXPECT_NE(message([] { Adadelta(fresh_param(), AdadeltaOptions().rho(1.75)); }).find("1.75"),
            std::string::npos);
  EXPECT_NE(message([] { Adadelta(fresh_param(), AdadeltaOptions(-3)); }).find("-3"),
            std::string::npos);
  EXPECT_NE(message([] { Lion(fresh_param(), LionOptions().weight_decay(-0.25)); }).find("-0.25"),
            std::string::npos);
  EXPECT_NE(
      message([] { Adafactor(fresh_param(), AdafactorOptions().decay_rate(-1.5)); }).find("-1.5"),
      std::string::npos);
  EXPECT_NE(message([] {
              Adafactor(fresh_param(), AdafactorOptions().beta1(1.0));
            }).find("beta1 value: 1"),
            std::string::npos);
}

TEST(OptimizerSettings, SettingsReachTheNewOptimizers) {
  auto adadelta = make_optimizer("adadelta", fresh_param(), 0.5, 0.01,
                                 {{"rho", "0.95"}, {"eps", "1e-5"}, {"maximize", "true"}});
  const auto& d = static_cast<const AdadeltaOptions&>(adadelta->param_groups()[0].options());
  EXPECT_DOUBLE_EQ(d.lr(), 0.5);
  EXPECT_DOUBLE_EQ(d.rho(), 0.95);
  EXPECT_DOUBLE_EQ(d.eps(), 1e-5);
  EXPECT_DOUBLE_EQ(d.weight_decay(), 0.01);
  EXPECT_TRUE(d.maximize());

  auto adamw = make_optimizer("adamw", fresh_param(), 2e-3, 0.05, {{"betas", "0.8,0.95"}});
  const auto& w =
      static_cast<const torch::optim::AdamWOptions&>(adamw->param_groups()[0].options());
  EXPECT_DOUBLE_EQ(std::get<0>(w.betas()), 0.8);
  EXPECT_DOUBLE_EQ(std::get<1>(w.betas()), 0.95);
  EXPECT_DOUBLE_EQ(w.weight_decay(), 0.05);

  auto lion = make_optimizer("lion", fresh_param(), 3e-4, 0.1, {{"betas", "0.95,0.98"}});
  const auto& l = static_cast<const LionOptions&>(lion->param_groups()[0].options());
  EXPECT_DOUBLE_EQ(l.lr(), 3e-4);
  EXPECT_DOUBLE_EQ(std::get<0>(l.betas()), 0.95);
  EXPECT_DOUBLE_EQ(std::get<1>(l.betas()), 0.98);
  EXPECT_DOUBLE_EQ(l.weight_decay(), 0.1);

  auto adafactor = make_optimizer("adafactor", fresh_param(), 1e-3, 0,
                                  {{"beta1", "0.9"},
                                   {"decay_rate", "-0.5"},
                                   {"clip_threshold", "2"},
                                   {"eps", "1e-20,1e-4"},
                                   {"relative_step", "false"},
                                   {"scale_parameter", "false"}});
  const auto& f = static_cast<const AdafactorOptions&>(adafactor->param_groups()[0].options());
  ASSERT_TRUE(f.beta1().has_value());
  EXPECT_DOUBLE_EQ(*f.beta1(), 0.9);
  EXPECT_DOUBLE_EQ(f.decay_rate(), -0.5);
  EXPECT_DOUBLE_EQ(f.clip_threshold(), 2.0);
  EXPECT_DOUBLE_EQ(f.eps1(), 1e-20);
  EXPECT_DOUBLE_EQ(f.eps2(), 1e-4);
  EXPECT_FALSE(f.relative_step());
  EXPECT_FALSE(f.scale_parameter());
  set_learning_rate(*adafactor, 5e-3);
  EXPECT_DOUBLE_EQ(f.lr(), 5e-3);
}

}  // namespace
}  // namespace gradscope
