#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "gradscope/core/error.h"
#include "gradscope/core/tensors.h"
#include "gradscope/measure/memory.h"
#include "gradscope/models/llama.h"
#include "gradscope/optim/factory.h"
#include "gradscope/strategy/strategy.h"
#include "gradscope/strategy/updater.h"
#include "gradscope/train/trainer.h"
#include "strategy/tiny_llama.h"
#include "test_util.h"

namespace gradscope {
namespace {

constexpr int kSteps = 3;

using testing::text_batch;
using testing::tiny_llama;

struct NoPhases : PhaseObserver {
  void enter(Phase) override {}
};

// Resets the allocator's peak when the backward starts.
struct BackwardPeak : PhaseObserver {
  void enter(Phase phase) override {
    if (phase == Phase::kBackward) CpuMemoryTracker::install().reset_peak();
  }
};

RunConfig optimizer_config(const std::string& optimizer, OptSettings opt = {}) {
  RunConfig c;
  c.model = "llama";
  c.preset = "tiny";
  c.strategy = parse_strategy("fused");
  c.optimizer = optimizer;
  c.opt = std::move(opt);
  c.weight_decay = 0.01;
  return c;
}

// The step plan of a --strategy shorthand.
StepPlan plan_of(const std::string& name) {
  RunConfig c;
  c.strategy = parse_strategy(name);
  return c.step_plan();
}

// The learning rate of step i: changes every step, so the schedule must reach the optimizers.
double lr_of(int step, double lr) { return lr * (1.0 + 0.5 * step); }

// The parameters after kSteps steps of standard training + the unfused optimizer.
std::vector<torch::Tensor> unfused_params(const RunConfig& c, double lr) {
  auto model = tiny_llama();
  const Strategy strategy(plan_of("standard"));
  auto optimizer = make_optimizer(c.optimizer, model->parameters(), lr, c.weight_decay, c.opt);
  NoPhases phases;
  for (int i = 0; i < kSteps; ++i) {
    const Batch batch = text_batch(2, 16, 100 + i);
    set_learning_rate(*optimizer, lr_of(i, lr));
    strategy.compute_gradients(
        *model, [&](int64_t) { return batch; }, phases);
    optimizer->step();
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
  }
  std::vector<torch::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

// The same with the fused step; checks that no gradient outlives the backward.
std::vector<torch::Tensor> fused_params(const RunConfig& c, double lr) {
  auto model = tiny_llama();
  const StepPlan plan = plan_of("fused");
  EXPECT_EQ(plan.optimizer_step, OptimizerStep::kInBackward);
  Strategy strategy(plan);
  strategy.attach(*model);
  auto updater = make_updater(plan, model->parameters(),
                              OptimizerSpec{c.optimizer, lr, c.weight_decay, c.opt}, {});
  NoPhases phases;
  for (int i = 0; i < kSteps; ++i) {
    const Batch batch = text_batch(2, 16, 100 + i);
    updater->set_learning_rate(lr_of(i, lr));
    const UpdateResult r = updater->step(
        [&] {
          return strategy.compute_gradients(
              *model, [&](int64_t) { return batch; }, phases);
        },
        phases);
    EXPECT_TRUE(std::isnan(r.grad_norm));
    for (const auto& p : model->parameters())
      EXPECT_FALSE(p.grad().defined()) << "a gradient outlived the backward at step " << i;
  }
  EXPECT_GT(updater->state_bytes(), 0);
  std::vector<torch::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

void expect_close(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& ref,
                  double tolerance) {
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    const auto a = got[i].to(torch::kFloat64);
    const auto b = ref[i].to(torch::kFloat64);
    const double rel = (a - b).norm().item<double>() / b.norm().item<double>();
    EXPECT_LE(rel, tolerance) << "parameter " << i;
  }
}

TEST(Fused, SgdWithMomentumIsBitwiseUnfused) {
  const RunConfig c = optimizer_config("sgd", {{"momentum", "0.9"}});
  const auto ref = unfused_params(c, 0.05);
  const auto got = fused_params(c, 0.05);
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_TRUE(torch::equal(got[i], ref[i])) << "parameter " << i;
  // The steps moved the parameters.
  const auto start = tiny_llama()->parameters();
  EXPECT_FALSE(torch::equal(got[0], start[0]));
}

TEST(Fused, AdamMatchesUnfused) {
  const RunConfig c = optimizer_config("adam");
  expect_close(fused_params(c, 1e-3), unfused_params(c, 1e-3), 1e-6);
}

TEST(Fused, AdagradAndAdadeltaMatchUnfused) {
  const RunConfig adagrad = optimizer_config("adagrad", {{"lr_decay", "0.01"}});
  expect_close(fused_params(adagrad, 1e-2), unfused_params(adagrad, 1e-2), 1e-6);
  const RunConfig adadelta = optimizer_config("adadelta");
  expect_close(fused_params(adadelta, 1.0), unfused_params(adadelta, 1.0), 1e-6);
}

// The backward's allocator peak, on the second step (optimizer state exists by then).
int64_t backward_peak(bool fused) {
  CpuMemoryTracker::install();
  const RunConfig c = optimizer_config("sgd", {{"momentum", "0.9"}});
  auto model = tiny_llama();
  const StepPlan plan = plan_of(fused ? "fused" : "standard");
  const Strategy strategy(plan);
  std::unique_ptr<Updater> updater;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (fused)
    updater =
        make_updater(plan, model->parameters(), OptimizerSpec{c.optimizer, 0.01, 0, c.opt}, {});
  else
    optimizer = make_optimizer(c.optimizer, model->parameters(), 0.01, 0, c.opt);
  BackwardPeak observer;
  int64_t peak = 0;
  for (int i = 0; i < 2; ++i) {
    // A short batch: its activations are small beside the gradients, whose bytes then decide
    // the backward's peak.
    const Batch batch = text_batch(1, 4, 100 + i);
    strategy.compute_gradients(
        *model, [&](int64_t) { return batch; }, observer);
    peak = CpuMemoryTracker::install().peak_bytes();
    if (optimizer) optimizer->step();
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
  }
  return peak;
}

TEST(Fused, BackwardPeakIsLowerThanStandards) {
  const int64_t params_bytes = tensors_bytes(tiny_llama()->parameters());
  const int64_t standard = backward_peak(false);
  const int64_t fused = backward_peak(true);
  EXPECT_LT(fused, standard);
  // Standard ends its backward holding every gradient; the fused step frees them as it goes.
  EXPECT_GT(standard - fused, params_bytes / 2)
      << "standard " << standard << " fused " << fused << " params " << params_bytes;
}

RunConfig trainer_config() {
  RunConfig c = testing::tiny_llama_config();
  c.strategy = parse_strategy("fused");
  c.optimizer = "sgd";
  c.lr = 1e-2;
  c.batch = 2;
  c.steps = 2;
  c.warmup_steps = 0;
  return c;
}

bool usage_error(const RunConfig& c, const std::string& needle) {
  try {
    Trainer t(c);
  } catch (const Error& e) {
    const std::string all = std::string(e.what()) + " " + e.hint();
    return e.kind() == ErrorKind::kUsage && all.find(needle) != std::string::npos;
  }
  return false;
}

TEST(Fused, TrainerRefusesClippingAndOtherOptimizers) {
  RunConfig clip = trainer_config();
  clip.clip_grad_norm = 1.0;
  EXPECT_TRUE(usage_error(clip, "--clip-grad-norm 0"));
  RunConfig adamw = trainer_config();
  adamw.optimizer = "adamw";
  EXPECT_TRUE(usage_error(adamw, "sgd, adam, adagrad, adadelta"));
  RunConfig accum = trainer_config();
  accum.accum_steps = 2;
  EXPECT_TRUE(usage_error(accum, "--accum-steps"));
}

TEST(Fused, TrainerRecordsWhatItCanMeasure) {
  RunConfig c = trainer_config();
  c.optimizer = "adam";
  c.lr = 3e-3;
  Trainer trainer(c);
  const auto record = record_to_json(trainer.run());
  ASSERT_EQ(record["status"], "ok") << record["failure"].dump();
  ASSERT_EQ(record["steps"].size(), 2u);
  for (const auto& s : record["steps"]) {
    EXPECT_TRUE(s["grad_norm"].is_null());
    EXPECT_TRUE(s["loss"].is_number());
  }
  EXPECT_TRUE(record["memory"]["grads_bytes"].is_null());
  // Adam: two moments per parameter (and a step count).
  EXPECT_GE(record["memory"]["optimizer_state_bytes"].get<int64_t>(),
            2 * record["memory"]["params_bytes"].get<int64_t>());
  for (const auto& p : trainer.model().parameters()) EXPECT_FALSE(p.grad().defined());
}

}  // namespace
}  // namespace gradscope
