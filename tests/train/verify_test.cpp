#include <gtest/gtest.h>

#include "gradscope/core/error.h"
#include "gradscope/train/verify.h"
#include "test_util.h"

namespace gradscope {
namespace {

RunConfig verify_config() {
  RunConfig c = testing::tiny_llama_config();
  c.batch = 2;
  c.accum_steps = 3;
  return c;
}

TEST(Verify, EveryStrategyHoldsOnTinyLlama) {
  const auto checks = verify_strategies(verify_config(), {});
  // Every strategy but standard, checkpointing under its three policies.
  ASSERT_EQ(checks.size(), 6u);
  std::vector<std::string> names;
  for (const auto& k : checks) {
    names.push_back(k.strategy);
    EXPECT_TRUE(k.passed) << k.strategy << " worst " << k.worst_tensor << " rel "
                          << k.grad_max_rel_diff;
    EXPECT_GT(k.tensors, 0);
    if (k.strategy.rfind("checkpoint", 0) == 0 && k.strategy.find('+') == std::string::npos) {
      EXPECT_EQ(k.criterion, "bitwise");
      EXPECT_EQ(k.grad_max_abs_diff, 0.0);
    } else if (k.strategy == "fused") {
      // Parameters after one Adam step (the config's optimizer) against the unfused step.
      EXPECT_EQ(k.criterion, "params relative <= 1e-06");
      EXPECT_LE(k.grad_max_rel_diff, 1e-6);
    } else {
      EXPECT_LE(k.grad_max_rel_diff, 1e-5);
    }
  }
  for (const char* name : {"checkpoint", "checkpoint (attention)", "checkpoint (mlp)"})
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
}

TEST(Verify, FusedSgdIsBitwise) {
  RunConfig c = verify_config();
  c.optimizer = "sgd";
  const auto checks = verify_strategies(c, {"fused"});
  ASSERT_EQ(checks.size(), 1u);
  EXPECT_EQ(checks[0].criterion, "params bitwise");
  EXPECT_TRUE(checks[0].passed);
  EXPECT_EQ(checks[0].grad_max_abs_diff, 0.0);
}

TEST(Verify, UnknownStrategyIsAUsageError) {
  EXPECT_THROW(verify_strategies(verify_config(), {"teleport"}), Error);
}

}  // namespace
}  // namespace gradscope

namespace gradscope {
namespace {

// The toy problems have no blocks and no dropout: every check still runs and holds.
// Every model of the study's grid: checkpointing bitwise under its three policies (vision and
// text blocks alike), accumulation within 1e-5.
TEST(Verify, EveryStrategyHoldsOnTheOtherModels) {
  for (const std::string model : {"vit", "modernbert", "nanovlm"}) {
    RunConfig c;
    c.model = model;
    c.batch = 2;
    c.accum_steps = 3;
    c.eval_batches = 1;
    if (model == "modernbert") c.dataset = testing::fixture("text/sotu-excerpt.txt");
    const auto checks = verify_strategies(c, {});
    ASSERT_EQ(checks.size(), 6u) << model;
    for (const auto& k : checks) {
      EXPECT_TRUE(k.passed) << model << " " << k.strategy << " worst " << k.worst_tensor << " rel "
                            << k.grad_max_rel_diff;
      if (k.criterion == "bitwise")
        EXPECT_EQ(k.grad_max_abs_diff, 0.0) << model << " " << k.strategy;
    }
  }
}

TEST(Verify, ToyProblemsHold) {
  for (const std::string model : {"quadratic", "rosenbrock"}) {
    RunConfig c;
    c.model = model;
    c.batch = 1;
    c.accum_steps = 2;
    const auto checks = verify_strategies(c, {});
    EXPECT_EQ(checks.size(), 4u) << model;  // one checkpoint policy: there are no sub-layers
    for (const auto& k : checks) EXPECT_TRUE(k.passed) << model << " " << k.strategy;
  }
}

}  // namespace
}  // namespace gradscope
