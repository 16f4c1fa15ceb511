#include <gtest/gtest.h>

#include "gradscope/core/error.h"
#include "gradscope/optim/factory.h"
#include "test_util.h"

namespace gradscope {
namespace {

std::vector<torch::Tensor> one_param() { return {torch::ones({3}, torch::requires_grad())}; }

// A usage error's message and hint, joined.
std::string usage_message(const std::function<void()>& f) {
  const Error e = testing::expect_usage_error(f);
  return std::string(e.what()) + " | " + e.hint();
}

TEST(OptimizerFactory, UnknownOptimizerListsValidOnes) {
  const auto msg = usage_message([] { make_optimizer("adamax", one_param(), 1e-3, 0, {}); });
  EXPECT_NE(msg.find("adamax"), std::string::npos);
  EXPECT_NE(msg.find("sgd, adam, adagrad"), std::string::npos);
}

TEST(OptimizerFactory, RefusesBadSettingsNamingTheValue) {
  EXPECT_NE(usage_message([] { make_optimizer("adam", one_param(), -1, 0, {}); }).find("-1"),
            std::string::npos);
  EXPECT_NE(usage_message([] { make_optimizer("adam", one_param(), 0, 0, {}); }).find("> 0"),
            std::string::npos);
  EXPECT_NE(usage_message([] {
              make_optimizer("adam", one_param(), 1e-3, 0, {{"betas", "0.9,1.5"}});
            }).find("1.5"),
            std::string::npos);
  EXPECT_NE(usage_message([] {
              make_optimizer("sgd", one_param(), 1e-3, 0, {{"momentum", "lots"}});
            }).find("lots"),
            std::string::npos);
  const auto unknown = usage_message([] {
    make_optimizer("sgd", one_param(), 1e-3, 0, {{"beta", "1"}});
  });
  EXPECT_NE(unknown.find("momentum, dampening, nesterov"), std::string::npos);
  EXPECT_NE(usage_message([] {
              make_optimizer("sgd", one_param(), 1e-3, 0, {{"nesterov", "true"}});
            }).find("nesterov"),
            std::string::npos);
}

TEST(OptimizerFactory, SettingsReachTheOptimizer) {
  auto sgd =
      make_optimizer("sgd", one_param(), 0.5, 0.01, {{"momentum", "0.9"}, {"nesterov", "true"}});
  const auto& o = static_cast<const torch::optim::SGDOptions&>(sgd->param_groups()[0].options());
  EXPECT_DOUBLE_EQ(o.lr(), 0.5);
  EXPECT_DOUBLE_EQ(o.momentum(), 0.9);
  EXPECT_TRUE(o.nesterov());
  EXPECT_DOUBLE_EQ(o.weight_decay(), 0.01);
  auto adam = make_optimizer("adam", one_param(), 1e-3, 0, {{"betas", "0.8,0.95"}});
  const auto& a = static_cast<const torch::optim::AdamOptions&>(adam->param_groups()[0].options());
  EXPECT_DOUBLE_EQ(std::get<0>(a.betas()), 0.8);
  EXPECT_DOUBLE_EQ(std::get<1>(a.betas()), 0.95);
  set_learning_rate(*adam, 0.25);
  EXPECT_DOUBLE_EQ(adam->param_groups()[0].options().get_lr(), 0.25);
}

TEST(OptimizerFactory, ParsesOptSettings) {
  OptSettings s;
  parse_opt_setting("betas=0.9,0.99", s);
  EXPECT_EQ(s.at("betas"), "0.9,0.99");
  EXPECT_THROW(parse_opt_setting("momentum", s), Error);
  EXPECT_THROW(parse_opt_setting("=3", s), Error);
}

}  // namespace
}  // namespace gradscope
