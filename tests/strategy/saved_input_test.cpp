// The block runner's layers (model.h: RunnerLayer) and --saved-input bf16, the memory method
// added through them: a checkpoint that keeps its input in bfloat16 until backward.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <torch/torch.h>

#include "gradscope/core/error.h"
#include "gradscope/core/settings.h"
#include "gradscope/strategy/checkpoint.h"
#include "gradscope/strategy/strategy.h"
#include "strategy/tiny_llama.h"
#include "test_util.h"

namespace gradscope {
namespace {

struct SilentPhases : PhaseObserver {
  void enter(Phase) override {}
};

// The loss and gradients of one step of `plan` on a fresh tiny Llama with dropout `p`.
std::pair<double, std::vector<torch::Tensor>> saved_input_step(const StepPlan& plan, double p) {
  auto model = testing::tiny_llama(p);
  Strategy strategy(plan);
  strategy.attach(*model);
  const Batch batch = testing::text_batch(4, 32, 11);
  SilentPhases phases;
  torch::manual_seed(1234);
  const StepOutput out =
      strategy.compute_gradients(*model, [batch](int64_t) { return batch; }, phases);
  std::vector<torch::Tensor> grads;
  for (auto& param : model->parameters())
    grads.push_back(param.grad().defined() ? param.grad().clone() : torch::zeros_like(param));
  return {out.loss_sum.item<double>(), grads};
}

StepPlan saved_input_plan(const std::vector<std::pair<std::string, std::string>>& settings) {
  RunConfig c;
  for (const auto& [name, value] : settings) find_setting(name)->parse(c, value);
  check_config(c);
  return c.step_plan();
}

TEST(RunnerLayers, RunOutermostFirstWhateverTheOrderOfInstalling) {
  auto model = testing::tiny_llama();
  std::vector<std::string> calls;
  // The inner layer first, as a strategy installs recomputation before the sharded updater.
  model->set_block_runner(RunnerLayer::kRecompute,
                          [&](Block& block, const torch::Tensor& x, const BlockContext& ctx,
                              const BlockRunner& inner) {
                            calls.push_back("recompute");
                            return inner(block, x, ctx);
                          });
  model->set_block_runner(RunnerLayer::kShard, [&](Block& block, const torch::Tensor& x,
                                                   const BlockContext& ctx,
                                                   const BlockRunner& inner) {
    calls.push_back("shard");
    return inner(block, x, ctx);
  });
  EXPECT_TRUE(model->has_block_runner());
  torch::NoGradGuard no_grad;
  model->loss(testing::text_batch(1, 8, 3));
  EXPECT_EQ(calls, (std::vector<std::string>{"shard", "recompute", "shard", "recompute"}));
  // An empty layer passes the block on.
  model->set_block_runner(RunnerLayer::kShard, nullptr);
  calls.clear();
  model->loss(testing::text_batch(1, 8, 3));
  EXPECT_EQ(calls, (std::vector<std::string>{"recompute", "recompute"}));
}

TEST(RunnerLayers, CheckpointingRunsTheLayersInsideIt) {
  // A checkpoint runs the layers inside its own in forward and again in its recompute.
  auto model = testing::tiny_llama();
  auto runner = install_checkpointing(*model, CheckpointOptions{});
  int inner_calls = 0;
  const auto grads = [&] {
    const Batch batch = testing::text_batch(2, 16, 5);
    model->zero_grad();
    model->loss(batch).loss_sum.backward();
    std::vector<torch::Tensor> out;
    for (auto& p : model->parameters())
      out.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
    return out;
  };
  const auto plain = grads();
  EXPECT_EQ(runner->counters().recomputed, 2);
  // Nothing else installed: the checkpoint called the blocks itself. Now with a layer
  // installed outside it, the checkpoint is still the one that recomputes.
  model->set_block_runner(RunnerLayer::kShard, [&](Block& block, const torch::Tensor& x,
                                                   const BlockContext& ctx,
                                                   const BlockRunner& inner) {
    ++inner_calls;
    return inner(block, x, ctx);
  });
  const auto wrapped = grads();
  EXPECT_EQ(inner_calls, 2);  // the forward only: the recompute is inside the checkpoint
  EXPECT_EQ(runner->counters().recomputed, 4);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::equal(plain[i], wrapped[i]));
}

TEST(SavedInput, ExactLossAndGradientsWithinTheBound) {
  for (const double p : {0.0, 0.1}) {
    const auto standard = saved_input_step(saved_input_plan({}), p);
    const auto exact = saved_input_step(saved_input_plan({{"strategy", "checkpoint"}}), p);
    const auto rounded = saved_input_step(
        saved_input_plan({{"strategy", "checkpoint"}, {"saved-input", "bf16"}}), p);
    // The forward runs on the input as computed: the loss is bitwise the standard one.
    EXPECT_EQ(rounded.first, standard.first);
    double worst = 0;
    bool differs = false;
    for (size_t i = 0; i < standard.second.size(); ++i) {
      EXPECT_TRUE(torch::equal(exact.second[i], standard.second[i]));
      const double ref = standard.second[i].norm().item<double>();
      const double diff = (rounded.second[i] - standard.second[i]).norm().item<double>();
      worst = std::max(worst, ref > 0 ? diff / ref : diff);
      differs = differs || diff > 0;
    }
    // The recompute ran from the rounded input (so the gradients moved), by a few units of
    // bfloat16's rounding at most (verify's bound, 2e-2).
    EXPECT_TRUE(differs) << "dropout " << p;
    EXPECT_LT(worst, 2e-2) << "dropout " << p;
  }
}

TEST(SavedInput, SelectivePoliciesKeepTheirBranchInputInBf16Too) {
  for (const char* policy : {"attention", "mlp"}) {
    const auto exact = saved_input_step(saved_input_plan({{"recompute", policy}}), 0.0);
    const auto rounded =
        saved_input_step(saved_input_plan({{"recompute", policy}, {"saved-input", "bf16"}}), 0.0);
    EXPECT_EQ(rounded.first, exact.first) << policy;
    double worst = 0;
    bool differs = false;
    for (size_t i = 0; i < exact.second.size(); ++i) {
      const double ref = exact.second[i].norm().item<double>();
      const double diff = (rounded.second[i] - exact.second[i]).norm().item<double>();
      worst = std::max(worst, ref > 0 ? diff / ref : diff);
      differs = differs || diff > 0;
    }
    // Recomputed from the rounded branch input (the gradients moved), not from another one
    // (they would be off by O(1)).
    EXPECT_TRUE(differs) << policy;
    EXPECT_LT(worst, 2e-2) << policy;
  }
}

TEST(SavedInput, NeedsRecomputationAndEntersTheIdOnlyWhenBf16) {
  RunConfig c;
  find_setting("saved-input")->parse(c, "bf16");
  const Error e = testing::expect_usage_error([&] { check_config(c); });
  EXPECT_NE(std::string(e.what()).find("--saved-input"), std::string::npos) << e.what();
  RunConfig checkpoint;
  find_setting("strategy")->parse(checkpoint, "checkpoint");
  RunConfig rounded = checkpoint;
  find_setting("saved-input")->parse(rounded, "bf16");
  check_config(rounded);
  EXPECT_EQ(rounded.step_plan().saved_input, Dtype::kBf16);
  const std::string id = canonical_config_json(checkpoint).dump();
  EXPECT_EQ(id.find("saved_input"), std::string::npos);
  EXPECT_NE(canonical_config_json(rounded).dump(), id);
  EXPECT_EQ(config_to_json(checkpoint).dump().find("saved_input"), std::string::npos);
  EXPECT_EQ(config_from_json(config_to_json(rounded)).saved_input, Dtype::kBf16);
}

}  // namespace
}  // namespace gradscope
