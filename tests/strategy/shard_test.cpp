// The sharded steps of one rank against the plain step: with one rank, ddp, zero1, zero2 and
// fsdp run their whole machinery (buckets from backward's hooks, the flat shard, the pieces'
// optimizer, fsdp's gathered and released blocks) with every collective the identity, so the
// parameters they leave must be the plain step's. Several ranks are tested through processes
// (tests/cli/distributed_cli_test.cpp).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "gradscope/core/error.h"
#include "gradscope/core/settings.h"
#include "gradscope/strategy/shard.h"
#include "gradscope/strategy/strategy.h"
#include "gradscope/strategy/updater.h"
#include "strategy/tiny_llama.h"
#include "test_util.h"

namespace gradscope {
namespace {

using testing::text_batch;
using testing::tiny_llama;

struct QuietObserver : PhaseObserver {
  void enter(Phase) override {}
};

struct Trained {
  std::vector<torch::Tensor> params;
  std::vector<double> losses;
  int64_t state_bytes = 0;
  std::optional<int64_t> grads_bytes;
};

// `steps` steps of Adam (accum_steps micro-batches each, recomputing blocks when asked) on the
// tiny Llama, plain or under `shard` with one rank.
Trained train(Shard shard, int64_t accum_steps, bool recompute, int steps = 3,
              int64_t bucket_bytes = 4096) {
  auto model = tiny_llama(0, 3);
  RunConfig c;
  c.accum_steps = accum_steps;
  if (recompute) c.recompute = Recompute::kFull;
  const StepPlan plan = c.step_plan();
  Strategy strategy(plan);
  strategy.attach(*model);
  OptimizerSpec spec;
  spec.name = "adam";
  spec.lr = 1e-2;
  for (const auto& p : model->named_parameters()) spec.param_names.push_back(p.key());
  std::unique_ptr<Updater> updater;
  std::shared_ptr<Communicator> comm;
  if (shard == Shard::kNone) {
    updater = make_updater(plan, model->parameters(), spec, UpdaterOptions{});
  } else {
    comm = single_rank_communicator();
    strategy.set_communicator(comm);
    updater = make_sharded_updater(plan, shard, model->parameters(), spec, UpdaterOptions{}, comm,
                                   bucket_bytes, model.get());
  }
  strategy.set_micro_batch_listener(updater->micro_batch_listener());
  QuietObserver observer;
  Trained t;
  for (int s = 0; s < steps; ++s) {
    const StepOutput out =
        updater
            ->step(
                [&] {
                  return strategy.compute_gradients(
                      *model, [s](int64_t i) { return text_batch(2, 16, 100 * s + i); }, observer);
                },
                observer)
            .out;
    t.losses.push_back(out.loss_sum.item<double>() / static_cast<double>(out.target_count));
  }
  t.state_bytes = updater->state_bytes();
  t.grads_bytes = updater->grads_bytes();
  updater->gather_parameters();
  for (const auto& p : model->parameters()) t.params.push_back(p.detach().clone());
  return t;
}

void expect_same(const Trained& got, const Trained& want, const std::string& what) {
  ASSERT_EQ(got.params.size(), want.params.size()) << what;
  for (size_t i = 0; i < want.params.size(); ++i) {
    const double diff = (got.params[i] - want.params[i]).abs().max().item<double>();
    EXPECT_LE(diff, 1e-6) << what << ": parameter " << i;
  }
  for (size_t i = 0; i < want.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[i], 1e-6) << what << ": step " << i;
}

TEST(Shard, EveryModeWithOneRankIsThePlainStep) {
  for (const bool recompute : {false, true}) {
    for (const int64_t accum : {int64_t{1}, int64_t{2}}) {
      const Trained plain = train(Shard::kNone, accum, recompute);
      for (const Shard shard :
           {Shard::kDdp, Shard::kZero1, Shard::kZero2, Shard::kFsdp}) {
        const Trained got = train(shard, accum, recompute);
        expect_same(got, plain,
                    fmt::format("{} accum {} recompute {}", shard_name(shard), accum, recompute));
        // One rank holds the whole state.
        EXPECT_EQ(got.state_bytes, plain.state_bytes) << shard_name(shard);
      }
    }
  }
}

TEST(Shard, TheStepsMoveTheParameters) {
  // The comparison above can fail: a sharded step that did nothing would leave the initial
  // weights, which differ from the plain step's result.
  const Trained plain = train(Shard::kNone, 1, false);
  const Trained none = train(Shard::kNone, 1, false, 0);
  double moved = 0;
  for (size_t i = 0; i < plain.params.size(); ++i)
    moved = std::max(moved, (plain.params[i] - none.params[i]).abs().max().item<double>());
  EXPECT_GT(moved, 1e-4);
}

TEST(Shard, BucketsOfAnySizeGiveTheSameStep) {
  const Trained plain = train(Shard::kNone, 1, false);
  for (const int64_t bucket : {int64_t{1024}, int64_t{64} << 10, int64_t{64} << 20})
    expect_same(train(Shard::kDdp, 1, false, 3, bucket), plain,
                fmt::format("bucket {}", bucket));
}

TEST(Shard, OptimizersThatNeedWholeTensorsAreRefusedUnderZeroAndFsdp) {
  RunConfig c;
  const StepPlan plan = c.step_plan();
  for (const char* name :
       {"galore", "adafactor", "adam8bit", "cg", "adam-mini", "muon", "apollo"}) {
    EXPECT_EQ(shard_refusal(Shard::kDdp, name), "") << name;
    for (const Shard shard : {Shard::kZero1, Shard::kZero2, Shard::kFsdp}) {
      const Error e = testing::expect_usage_error([&] { check_shard(plan, shard, name); });
      EXPECT_TRUE(testing::contains(e.what(), name)) << e.what();
    }
  }
  for (const auto& name : elementwise_optimizers())
    for (const Shard shard : {Shard::kZero1, Shard::kZero2, Shard::kFsdp})
      EXPECT_NO_THROW(check_shard(plan, shard, name)) << name;
}

TEST(Shard, TheOptimizerCannotStepInBackward) {
  RunConfig c;
  find_setting("strategy")->parse(c, "fused");
  const Error e =
      testing::expect_usage_error([&] { check_shard(c.step_plan(), Shard::kDdp, "sgd"); });
  EXPECT_TRUE(testing::contains(e.what(), "inside backward")) << e.what();
}

}  // namespace
}  // namespace gradscope
