// How a step is computed, as independent settings with --strategy as a shorthand.
#include <gtest/gtest.h>

#include "gradscope/core/config.h"
#include "gradscope/core/error.h"
#include "gradscope/core/settings.h"
#include "test_util.h"

namespace gradscope {
namespace {

RunConfig with(const std::vector<std::pair<std::string, std::string>>& settings) {
  RunConfig c;
  for (const auto& [name, value] : settings) find_setting(name)->parse(c, value);
  return c;
}

TEST(StepPlan, TheStudysStrategiesAreShorthands) {
  struct Case {
    const char* strategy;
    Recompute recompute;
    bool micro_batches;
    OptimizerStep step;
  };
  const Case cases[] = {
      {"standard", Recompute::kNone, false, OptimizerStep::kAfterBackward},
      {"checkpoint", Recompute::kFull, false, OptimizerStep::kAfterBackward},
      {"accumulation", Recompute::kNone, true, OptimizerStep::kAfterBackward},
      {"checkpoint+accumulation", Recompute::kFull, true,
       OptimizerStep::kAfterBackward},
      {"fused", Recompute::kNone, false, OptimizerStep::kInBackward},
      {"checkpoint+fused", Recompute::kFull, false,
       OptimizerStep::kInBackward},
  };
  for (const Case& k : cases) {
    const StepPlan p = with({{"strategy", k.strategy}}).step_plan();
    EXPECT_EQ(p.recompute, k.recompute) << k.strategy;
    EXPECT_EQ(p.micro_batches, k.micro_batches) << k.strategy;
    EXPECT_EQ(p.optimizer_step, k.step) << k.strategy;
    EXPECT_EQ(p.strategy_name(), k.strategy);
  }
  // Unknown names and parts out of their order are not strategies.
  for (const char* name : {"teleport", "fused+checkpoint", "accumulation+checkpoint", "", "+"})
    EXPECT_FALSE(parse_strategy(name).has_value()) << name;
}

TEST(StepPlan, TheSettingsAloneSayItWithoutAStrategy) {
  EXPECT_EQ(RunConfig{}.step_plan().strategy_name(), "standard");
  EXPECT_EQ(with({{"accum-steps", "4"}}).step_plan().strategy_name(), "accumulation");
  EXPECT_EQ(with({{"recompute", "attention"}}).step_plan().strategy_name(), "checkpoint");
  EXPECT_EQ(with({{"recompute", "full"}, {"accum-steps", "2"}}).step_plan().strategy_name(),
            "checkpoint+accumulation");
  EXPECT_EQ(with({{"optimizer-step", "in-backward"}}).step_plan().strategy_name(), "fused");
  const StepPlan p = with({{"recompute", "mlp"}, {"checkpoint-every", "3"}}).step_plan();
  EXPECT_EQ(p.recompute, Recompute::kMlp);
  EXPECT_EQ(p.recompute_every, 3);
  // --checkpoint-policy refines a checkpoint strategy, as it always has.
  EXPECT_EQ(with({{"strategy", "checkpoint"}, {"checkpoint-policy", "mlp"}}).step_plan().recompute,
            Recompute::kMlp);
  // Accumulation named with one micro-batch keeps its name (and its run id).
  EXPECT_EQ(with({{"strategy", "accumulation"}}).step_plan().strategy_name(), "accumulation");
}

TEST(StepPlan, AStrategyFixesThePartsItNames) {
  const std::vector<std::vector<std::pair<std::string, std::string>>> refused = {
      {{"strategy", "standard"}, {"accum-steps", "4"}},
      {{"strategy", "checkpoint"}, {"accum-steps", "2"}},
      {{"strategy", "fused"}, {"accum-steps", "2"}},
      {{"strategy", "standard"}, {"recompute", "full"}},
      {{"strategy", "checkpoint"}, {"recompute", "none"}},
      {{"strategy", "fused"}, {"optimizer-step", "after-backward"}},
      {{"strategy", "standard"}, {"optimizer-step", "in-backward"}},
      {{"recompute", "attention"}, {"checkpoint-policy", "mlp"}},
  };
  for (const auto& settings : refused) {
    std::string what;
    for (const auto& [k, v] : settings) what += "--" + k + " " + v + " ";
    try {
      with(settings).step_plan();
      ADD_FAILURE() << what << "was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage) << what;
      // The message names the setting that disagrees.
      const std::string all = std::string(e.what()) + " " + e.hint();
      EXPECT_NE(all.find("--" + settings.back().first), std::string::npos) << what << all;
    }
  }
}

}  // namespace
}  // namespace gradscope
