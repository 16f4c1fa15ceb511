// The toy problems: their minima, conditioning and starts are what the header promises, and
// --arch overrides reach them (and refuse what does not fit).
#include <gtest/gtest.h>

#include "gradscope/models/registry.h"
#include "gradscope/models/toy.h"
#include "gradscope/train/session.h"
#include "test_util.h"

namespace gradscope {
namespace {

std::shared_ptr<ToyModel> build(const std::string& model, const std::string& preset,
                                std::map<std::string, std::string> overrides = {}) {
  RunConfig c;
  c.model = model;
  c.preset = preset;
  c.arch_overrides = std::move(overrides);
  const auto arch = resolve_arch(c);
  return std::dynamic_pointer_cast<ToyModel>(model_registry().get(model).build(arch, 0));
}

double loss_at(ToyModel& m, const torch::Tensor& x) {
  torch::NoGradGuard no_grad;
  m.point().copy_(x);
  return m.loss(Batch{}).loss_sum.item<double>();
}

TEST(ToyQuadratic, MinimumIsZeroAtTheMinimizerWithZeroGradient) {
  auto m = build("quadratic", "small");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->point().numel(), 100);
  EXPECT_EQ(m->point().scalar_type(), torch::kFloat64);
  EXPECT_GT(m->loss(Batch{}).loss_sum.item<double>(), 1.0);  // starts away from it
  EXPECT_NEAR(loss_at(*m, m->minimizer()), 0.0, 1e-20);
  m->point().mutable_grad() = torch::Tensor();
  m->loss(Batch{}).loss_sum.backward();
  EXPECT_LT(m->point().grad().abs().max().item<double>(), 1e-10);
}

TEST(ToyQuadratic, HessianHasTheConditionNumberAsked) {
  auto m = build("quadratic", "tiny", {{"dim", "6"}, {"condition", "250"}});
  ASSERT_EQ(m->point().numel(), 6);
  // The Hessian from autograd, column by column: the loss is 1/2 e^T A e, so H = A.
  std::vector<torch::Tensor> columns;
  for (int64_t i = 0; i < 6; ++i) {
    auto x = torch::zeros({6}, torch::kFloat64);
    x[i] = 1.0;
    m->point().mutable_grad() = torch::Tensor();
    {
      torch::NoGradGuard no_grad;
      m->point().copy_(m->minimizer() + x);
    }
    m->loss(Batch{}).loss_sum.backward();
    columns.push_back(m->point().grad().clone());
  }
  auto h = torch::stack(columns, 1);
  auto eig = at::linalg_eigvalsh(h);
  EXPECT_NEAR((eig.max() / eig.min()).item<double>(), 250.0, 1e-8);
  EXPECT_NEAR(eig.min().item<double>(), 1.0, 1e-10);
}

TEST(ToyRosenbrock, StartsAtTheClassicPointAndIsZeroAtOnes) {
  auto m = build("rosenbrock", "tiny");
  EXPECT_TRUE(torch::equal(m->point().detach(), torch::tensor({-1.2, 1.0}, torch::kFloat64)));
  EXPECT_NEAR(m->loss(Batch{}).loss_sum.item<double>(), 24.2, 1e-12);  // the textbook value
  EXPECT_EQ(loss_at(*m, torch::ones({2}, torch::kFloat64)), 0.0);
  auto big = build("rosenbrock", "small");
  EXPECT_EQ(big->point().numel(), 100);
  EXPECT_EQ(big->point()[98].item<double>(), -1.2);
  EXPECT_EQ(big->point()[99].item<double>(), 1.0);
}

TEST(ArchOverrides, RefuseUnknownKeysWrongTypesAndDedicatedFlags) {
  auto refused = [](const std::string& model, std::map<std::string, std::string> o) {
    RunConfig c;
    c.model = model;
    c.arch_overrides = std::move(o);
    const Error e = testing::expect_usage_error([&] { resolve_arch(c); });
    return std::string(e.what()) + " | " + e.hint();
  };
  EXPECT_NE(refused("quadratic", {{"size", "3"}}).find("'size'"), std::string::npos);
  EXPECT_NE(refused("quadratic", {{"size", "3"}}).find("dim"), std::string::npos);
  EXPECT_NE(refused("quadratic", {{"dim", "2.5"}}).find("dim=2.5"), std::string::npos);
  EXPECT_NE(refused("llama", {{"num_hidden_layers", "many"}}).find("many"), std::string::npos);
  EXPECT_NE(refused("llama", {{"vocab_size", "512"}}).find("--tokenizer"), std::string::npos);
  EXPECT_NE(refused("llama", {{"seq_len", "16"}}).find("--seq"), std::string::npos);
}

TEST(ArchOverrides, ReachTheLlamaArchitecture) {
  RunConfig c;
  c.arch_overrides = {{"num_hidden_layers", "3"}, {"rms_norm_eps", "2e-6"}};
  const auto arch = resolve_arch(c);
  EXPECT_EQ(arch["num_hidden_layers"].get<int64_t>(), 3);
  EXPECT_DOUBLE_EQ(arch["rms_norm_eps"].get<double>(), 2e-6);
}

}  // namespace
}  // namespace gradscope
