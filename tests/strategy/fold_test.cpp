// Accumulation without a gradient buffer (accumulation+fused): each micro-batch's gradient is
// folded into the optimizer state in backward and freed; the parameters move after the last.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/core/tensors.h"
#include "gradscope/measure/memory.h"
#include "gradscope/optim/factory.h"
#include "gradscope/optim/micro_batch_fold.h"
#include "gradscope/strategy/strategy.h"
#include "gradscope/strategy/updater.h"
#include "gradscope/train/trainer.h"
#include "strategy/tiny_llama.h"
#include "test_util.h"

namespace gradscope {
namespace {

using testing::text_batch;
using testing::tiny_llama;

struct FoldPhases : PhaseObserver {
  void enter(Phase) override {}
};

// Three micro-batches of two rows; the rows' lengths differ, so the micro-batches hold 19, 32
// and 21 targets: each must weigh as its targets do.
constexpr int64_t kFoldMicro = 2;
constexpr int64_t kFoldCount = 3;
constexpr int64_t kFoldSeq = 16;
constexpr int kFoldSteps = 2;

StepPlan fold_plan(const std::string& name, int64_t micro_batches) {
  RunConfig c;
  c.strategy = parse_strategy(name);
  c.accum_steps = micro_batches;
  return c.step_plan();
}

Batch fold_effective_batch(int step) {
  return text_batch(kFoldMicro * kFoldCount, kFoldSeq, 300 + step, {16, 3, 16, 16, 9, 12});
}

Batch fold_micro_batch(const Batch& whole, int64_t i) {
  Batch b;
  b.input_ids = whole.input_ids.narrow(0, i * kFoldMicro, kFoldMicro).clone();
  b.targets = whole.targets.narrow(0, i * kFoldMicro, kFoldMicro).clone();
  b.samples = kFoldMicro;
  b.tokens = kFoldMicro * kFoldSeq;
  b.targets_count = b.targets.ne(kIgnoreIndex).sum().item<int64_t>();
  return b;
}

std::vector<torch::Tensor> fold_snapshot(Model& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model.parameters()) out.push_back(p.detach().to(torch::kFloat64).clone());
  return out;
}

// Training with the unfused optimizer after backward, on the whole effective batch in one
// micro-batch (standard) or in kFoldCount of them (ordinary accumulation, a gradient buffer).
std::vector<torch::Tensor> fold_reference(const OptimizerSpec& spec, bool micro_batches = false) {
  auto model = tiny_llama();
  const Strategy strategy(micro_batches ? fold_plan("accumulation", kFoldCount)
                                        : fold_plan("standard", 1));
  auto optimizer =
      make_optimizer(spec.name, model->parameters(), spec.lr, spec.weight_decay, spec.opt);
  FoldPhases phases;
  for (int step = 0; step < kFoldSteps; ++step) {
    const Batch whole = fold_effective_batch(step);
    strategy.compute_gradients(
        *model, [&](int64_t i) { return micro_batches ? fold_micro_batch(whole, i) : whole; },
        phases);
    optimizer->step();
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
  }
  return fold_snapshot(*model);
}

// accumulation+fused over the same data, in kFoldCount micro-batches: no gradient is left
// after any step.
std::vector<torch::Tensor> fold_trained(const OptimizerSpec& spec,
                                        std::optional<std::string>* rule = nullptr) {
  auto model = tiny_llama();
  const StepPlan plan = fold_plan("accumulation+fused", kFoldCount);
  EXPECT_EQ(plan.optimizer_step, OptimizerStep::kInBackward);
  EXPECT_TRUE(plan.micro_batches);
  Strategy strategy(plan);
  strategy.attach(*model);
  auto updater = make_updater(plan, model->parameters(), spec, {});
  EXPECT_NE(updater->micro_batch_listener(), nullptr);
  strategy.set_micro_batch_listener(updater->micro_batch_listener());
  FoldPhases phases;
  for (int step = 0; step < kFoldSteps; ++step) {
    const Batch whole = fold_effective_batch(step);
    updater->set_learning_rate(spec.lr);
    const UpdateResult r = updater->step(
        [&] {
          return strategy.compute_gradients(
              *model, [&](int64_t i) { return fold_micro_batch(whole, i); }, phases);
        },
        phases);
    EXPECT_TRUE(std::isnan(r.grad_norm));
    EXPECT_EQ(r.out.target_count, 72);
    for (const auto& p : model->parameters())
      EXPECT_FALSE(p.grad().defined()) << "a gradient outlived step " << step;
  }
  EXPECT_GT(updater->state_bytes(), 0);
  EXPECT_FALSE(updater->grads_bytes().has_value());
  if (rule) *rule = updater->update_rule();
  return fold_snapshot(*model);
}

// What the steps moved each parameter by, compared per tensor: ||a - b|| / ||b||.
double worst_update_difference(const std::vector<torch::Tensor>& got,
                               const std::vector<torch::Tensor>& ref) {
  const std::vector<torch::Tensor> start = fold_snapshot(*tiny_llama());
  EXPECT_EQ(got.size(), ref.size());
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const torch::Tensor a = got[i] - start[i];
    const torch::Tensor b = ref[i] - start[i];
    const double norm = b.norm().item<double>();
    EXPECT_GT(norm, 0) << "parameter " << i << " did not move";
    worst = std::max(worst, (a - b).norm().item<double>() / norm);
  }
  return worst;
}

// The worst ||a - b|| / ||b|| over the parameters themselves.
double worst_parameter_difference(const std::vector<torch::Tensor>& got,
                                  const std::vector<torch::Tensor>& ref) {
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    worst = std::max(worst, (got[i] - ref[i]).norm().item<double>() / ref[i].norm().item<double>());
  return worst;
}

// SGD with momentum folds exactly: the parameters of standard training on the whole effective
// batch, up to the order of float32 sums, after two steps (the second decays the buffer and
// dampens). Compared as parameters: their float32 rounding (2^-24 relative) is what an update
// compared alone cannot see below, 3e-6 of an update here. Against ordinary accumulation with
// a gradient buffer (whose micro-batch gradients are the fold's bit for bit) and against
// standard training alike within 1e-6, where a dropped or doubled micro-batch would move
// them by a third of the steps (checked to be far above 1e-6).
TEST(Fused, AccumulationSgdMomentumEqualsStandardOnTheEffectiveBatch) {
  const auto start = fold_snapshot(*tiny_llama());
  for (const double decay : {0.0, 0.1}) {
    OptimizerSpec spec{"sgd", 0.05, decay, {{"momentum", "0.9"}, {"dampening", "0.2"}}};
    const auto folded = fold_trained(spec);
    const auto standard = fold_reference(spec);
    const double vs_standard = worst_parameter_difference(folded, standard);
    const double vs_buffered = worst_parameter_difference(folded, fold_reference(spec, true));
    EXPECT_LE(vs_standard, 1e-6) << "weight decay " << decay;
    EXPECT_LE(vs_buffered, 1e-6) << "weight decay " << decay;
    // The smallest relative move of a parameter tensor: a third of it is the error 1e-6 bounds.
    double least_move = INFINITY;
    for (size_t i = 0; i < start.size(); ++i)
      least_move = std::min(least_move, (standard[i] - start[i]).norm().item<double>() /
                                            standard[i].norm().item<double>());
    EXPECT_GT(least_move / 3, 1e-5);
    const std::string suffix = decay > 0 ? "_with_decay" : "";
    RecordProperty("vs_standard" + suffix, fmt::format("{:.3g}", vs_standard));
    RecordProperty("vs_accumulation" + suffix, fmt::format("{:.3g}", vs_buffered));
    RecordProperty("least_move" + suffix, fmt::format("{:.3g}", least_move));
  }
}

// The fold does not take the update rule of the one optimizer over the summed gradient (the
// control): Adam's second moment of the summed gradient is not AdamA's sum of squares, so the
// two differ far beyond float rounding; and the record is told.
TEST(Fused, AccumulationAdamIsAdamANotAdam) {
  OptimizerSpec spec{"adam", 1e-3, 0.0, {}};
  std::optional<std::string> rule;
  const double worst = worst_update_difference(fold_trained(spec, &rule), fold_reference(spec));
  EXPECT_GT(worst, 1e-3);
  RecordProperty("worst", fmt::format("{:.3g}", worst));
  EXPECT_EQ(rule.value_or(""), "adama");
  std::optional<std::string> sgd_rule = std::string("?");
  fold_trained(OptimizerSpec{"sgd", 0.05, 0.0, {{"momentum", "0.9"}}}, &sgd_rule);
  EXPECT_FALSE(sgd_rule.has_value());
}

// The wiring of AdamA through the strategy's hooks: tiny Llama, three micro-batches of unequal
// target counts, two steps, against AdamA computed in float64 from each micro-batch's
// gradient taken apart (its summed loss over the step's targets).
TEST(Fused, AccumulationAdamFollowsAdamAOnTinyLlama) {
  const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, decay = 0.05;
  OptimizerSpec spec{"adam", lr, decay, {}};
  const auto got = fold_trained(spec);

  auto model = tiny_llama();
  const Strategy one(fold_plan("standard", 1));
  FoldPhases phases;
  std::vector<torch::Tensor> m, v;
  for (const auto& p : model->parameters()) {
    m.push_back(torch::zeros(p.sizes(), torch::kFloat64));
    v.push_back(torch::zeros(p.sizes(), torch::kFloat64));
  }
  for (int step = 0; step < kFoldSteps; ++step) {
    const Batch whole = fold_effective_batch(step);
    const double n = static_cast<double>(whole.targets_count);
    auto params = model->parameters();
    for (size_t j = 0; j < params.size(); ++j) {
      m[j] *= b1;
      v[j] *= b2;
    }
    for (int64_t i = 0; i < kFoldCount; ++i) {
      const Batch micro = fold_micro_batch(whole, i);
      const double share = static_cast<double>(micro.targets_count) / n;
      // The micro-batch's mean-per-target gradient, scaled to its share of the step's loss.
      one.compute_gradients(
          *model, [&](int64_t) { return micro; }, phases);
      for (size_t j = 0; j < params.size(); ++j) {
        const torch::Tensor p = params[j].detach().to(torch::kFloat64);
        const torch::Tensor h = params[j].grad().to(torch::kFloat64) * share + share * decay * p;
        m[j] += (1 - b1) * h;
        v[j] += (1 - b2) * h * h;
        params[j].mutable_grad() = torch::Tensor();
      }
    }
    const double t = step + 1;
    torch::NoGradGuard no_grad;
    for (size_t j = 0; j < params.size(); ++j) {
      const torch::Tensor p = params[j].detach().to(torch::kFloat64);
      const torch::Tensor denom = (v[j] / (1 - std::pow(b2, t))).sqrt() + eps;
      params[j].copy_(p - lr / (1 - std::pow(b1, t)) * m[j] / denom);
    }
  }
  // float32 parameters and moments against float64 ones: relative 1e-5 of each update.
  const double worst = worst_update_difference(got, fold_snapshot(*model));
  EXPECT_LE(worst, 1e-5);
  RecordProperty("worst", fmt::format("{:.3g}", worst));
}

// The backward's peak over a step of micro-batches: ordinary accumulation holds every
// gradient from the first micro-batch on; the fold holds one parameter's at a time.
int64_t fold_step_peak(bool fold) {
  CpuMemoryTracker::install();
  auto model = tiny_llama();
  const StepPlan plan = fold ? fold_plan("accumulation+fused", 2) : fold_plan("accumulation", 2);
  Strategy strategy(plan);
  const OptimizerSpec spec{"sgd", 0.01, 0.0, {{"momentum", "0.9"}}};
  auto updater = make_updater(plan, model->parameters(), spec, {});
  strategy.set_micro_batch_listener(updater->micro_batch_listener());
  FoldPhases phases;
  int64_t peak = 0;
  for (int step = 0; step < 2; ++step) {
    // Short micro-batches: their activations are small beside the gradients.
    const Batch batch = text_batch(1, 4, 100 + step);
    CpuMemoryTracker::install().reset_peak();
    updater->step(
        [&] {
          return strategy.compute_gradients(
              *model, [&](int64_t) { return batch; }, phases);
        },
        phases);
    peak = CpuMemoryTracker::install().peak_bytes();
  }
  return peak;
}

TEST(Fused, AccumulationWithoutABufferLowersTheStepsPeak) {
  const int64_t params_bytes = tensors_bytes(tiny_llama()->parameters());
  const int64_t buffered = fold_step_peak(false);
  const int64_t folded = fold_step_peak(true);
  EXPECT_GT(buffered - folded, params_bytes / 2)
      << "accumulation " << buffered << " folded " << folded << " params " << params_bytes;
}

// A run through the trainer: the record says which rule moved the parameters, has no gradient
// buffer, and its estimate (which knows there is none) is within 15% of the measured peak.
TEST(Fused, AccumulationRunRecordsItsRuleAndItsEstimateHolds) {
  for (const std::string optimizer : {"sgd", "adam"}) {
    RunConfig c = testing::tiny_llama_config();
    c.strategy = parse_strategy("accumulation+fused");
    c.accum_steps = 3;
    c.batch = 2;
    c.steps = 2;
    c.warmup_steps = 1;
    c.optimizer = optimizer;
    if (optimizer == "sgd") c.opt = {{"momentum", "0.9"}};
    Trainer trainer(c);
    const auto record = record_to_json(trainer.run());
    ASSERT_EQ(record["status"], "ok") << record["failure"].dump();
    if (optimizer == "adam")
      EXPECT_EQ(record["update_rule"], "adama");
    else
      EXPECT_TRUE(record["update_rule"].is_null());
    EXPECT_TRUE(record["memory"]["grads_bytes"].is_null());
    EXPECT_EQ(record["estimate"]["grads_bytes"], 0);
    const double measured = record["memory"]["peak_bytes"].get<double>();
    const double estimated = record["estimate"]["peak_bytes"].get<double>();
    EXPECT_NEAR(estimated / measured, 1.0, 0.15)
        << optimizer << ": estimated " << estimated << ", measured " << measured;
    RecordProperty("estimate_over_measured_" + optimizer,
                   fmt::format("{:.3f}", estimated / measured));
    for (const auto& p : trainer.model().parameters()) EXPECT_FALSE(p.grad().defined());
  }
}

// ---------------------------------------------------------------------------------------
// The rule itself, without a model: AdamA against a float64 re-statement of it.

struct AdamVariant {
  std::string name;
  double decay;
  bool amsgrad;
};

TEST(FoldRule, AdamAMatchesItsFloat64Restatement) {
  const double lr = 0.01, b1 = 0.9, b2 = 0.99, eps = 1e-8;
  const std::vector<double> shares = {0.2, 0.5, 0.3};  // unequal target counts
  for (const AdamVariant& a : {AdamVariant{"adam", 0.0, false}, AdamVariant{"adam", 0.1, false},
                               AdamVariant{"adamw", 0.1, false}, AdamVariant{"adam", 0.1, true}}) {
    auto gen = at::detail::createCPUGenerator(11);
    torch::Tensor p = torch::randn({6}, gen, torch::kFloat64);
    OptSettings opt = {{"betas", "0.9,0.99"}, {"eps", "1e-8"}};
    if (a.amsgrad) opt["amsgrad"] = "true";
    auto optimizer = make_optimizer(a.name, {p}, lr, a.decay, opt);
    MicroBatchFold fold(*optimizer, p);
    EXPECT_TRUE(fold_is_adama(*optimizer));

    std::vector<double> P(6), M(6, 0), V(6, 0), Vmax(6, 0);
    for (int e = 0; e < 6; ++e) P[static_cast<size_t>(e)] = p[e].item<double>();
    for (int step = 1; step <= 4; ++step) {
      std::vector<torch::Tensor> grads;
      for (size_t i = 0; i < shares.size(); ++i)
        grads.push_back(torch::randn({6}, gen, torch::kFloat64) * shares[i]);
      // Step 3: micro-batch 1 gives this parameter no gradient.
      const bool skip = step == 3;
      UnfoldedShares unfolded;
      for (size_t i = 0; i < shares.size(); ++i) {
        if (skip && i == 1) {
          unfolded.share += shares[i];
          unfolded.share_sq += shares[i] * shares[i];
          continue;
        }
        fold.fold(grads[i], shares[i]);
      }
      EXPECT_TRUE(fold.pending());
      fold.update(unfolded);
      EXPECT_FALSE(fold.pending());

      const bool l2 = a.name == "adam" && a.decay > 0;
      for (size_t e = 0; e < 6; ++e) {
        M[e] *= b1;
        V[e] *= b2;
        for (size_t i = 0; i < shares.size(); ++i) {
          const double g = skip && i == 1 ? 0.0 : grads[i][static_cast<int64_t>(e)].item<double>();
          const double h = g + (l2 ? shares[i] * a.decay * P[e] : 0.0);
          M[e] += (1 - b1) * h;
          V[e] += (1 - b2) * h * h;
        }
        if (a.name == "adamw") P[e] *= 1 - lr * a.decay;
        Vmax[e] = std::max(Vmax[e], V[e]);
        const double v = a.amsgrad ? Vmax[e] : V[e];
        const double denom = std::sqrt(v / (1 - std::pow(b2, step))) + eps;
        P[e] -= lr / (1 - std::pow(b1, step)) * M[e] / denom;
      }
      for (size_t e = 0; e < 6; ++e)
        EXPECT_NEAR(p[static_cast<int64_t>(e)].item<double>(), P[e], 1e-12 * std::abs(P[e]) + 1e-15)
            << a.name << " decay " << a.decay << " amsgrad " << a.amsgrad << " step " << step;
    }
  }
}

// With one micro-batch the fold is the optimizer's own update: Adam's and AdamW's fused step
// (the fold computes LibTorch's formula, which the kernel matches to float64 rounding).
TEST(FoldRule, OneMicroBatchIsTheOptimizersOwnStep) {
  for (const std::string name : {"adam", "adamw", "sgd"}) {
    auto gen = at::detail::createCPUGenerator(5);
    torch::Tensor folded = torch::randn({8}, gen, torch::kFloat64);
    torch::Tensor plain = folded.clone().requires_grad_(true);
    const OptSettings opt =
        name == "sgd" ? OptSettings{{"momentum", "0.9"}, {"dampening", "0.1"}} : OptSettings{};
    auto folding = make_optimizer(name, {folded}, 0.01, 0.1, opt);
    auto reference = make_optimizer(name, {plain}, 0.01, 0.1, opt);
    MicroBatchFold fold(*folding, folded);
    for (int step = 0; step < 3; ++step) {
      const torch::Tensor g = torch::randn({8}, gen, torch::kFloat64);
      fold.fold(g, 1.0);
      fold.update();
      plain.mutable_grad() = g.clone();
      reference->step();
      EXPECT_TRUE(torch::allclose(folded, plain.detach(), 1e-12, 1e-14))
          << name << " step " << step;
    }
  }
}

// ---------------------------------------------------------------------------------------
// What cannot fold is refused, naming the conflict and what to use instead.

std::string fold_refusal_of(const std::string& optimizer, const OptSettings& opt, double clip = 0) {
  auto model = tiny_llama(0, 1);
  UpdaterOptions options;
  options.clip_grad_norm = clip;
  try {
    make_updater(fold_plan("accumulation+fused", 2), model->parameters(),
                 OptimizerSpec{optimizer, 0.01, 0, opt}, options);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    return std::string(e.what()) + " | " + e.hint();
  }
  return "";
}

TEST(FoldRule, WhatCannotFoldIsRefusedNamingTheConflict) {
  const std::string plain = fold_refusal_of("sgd", {});
  EXPECT_TRUE(testing::contains(plain, "SGD without momentum")) << plain;
  EXPECT_TRUE(testing::contains(plain, "--opt momentum=0.9")) << plain;
  const std::string nesterov = fold_refusal_of("sgd", {{"momentum", "0.9"}, {"nesterov", "true"}});
  EXPECT_TRUE(testing::contains(nesterov, "Nesterov")) << nesterov;
  const std::string clip = fold_refusal_of("sgd", {{"momentum", "0.9"}}, 1.0);
  EXPECT_TRUE(testing::contains(clip, "--clip-grad-norm 1")) << clip;
  EXPECT_TRUE(testing::contains(clip, "--optimizer-step after-backward")) << clip;
  for (const std::string name : {"adagrad", "adadelta", "cg", "lion", "adafactor", "adam8bit"}) {
    const std::string refused = fold_refusal_of(name, {});
    EXPECT_TRUE(testing::contains(refused, "optimizer '" + name + "'")) << refused;
    EXPECT_TRUE(testing::contains(refused, "sgd, adam, adamw")) << refused;
    EXPECT_TRUE(testing::contains(refused, "--optimizer-step after-backward")) << refused;
  }
  // What folds is taken, and the fused step without micro-batches is as it was.
  EXPECT_EQ(fold_refusal_of("sgd", {{"momentum", "0.9"}}), "");
  EXPECT_EQ(fold_refusal_of("adam", {}), "");
  EXPECT_EQ(fold_refusal_of("adamw", {}), "");
  auto model = tiny_llama(0, 1);
  EXPECT_EQ(make_updater(fold_plan("fused", 1), model->parameters(), OptimizerSpec{"sgd", 0.01}, {})
                ->micro_batch_listener(),
            nullptr);
}

// A strategy that does not announce its micro-batches cannot drive the fold: a runtime
// error, not a silent update after the first micro-batch.
TEST(FoldRule, UnannouncedMicroBatchesAreAnError) {
  auto model = tiny_llama(0, 1);
  const StepPlan plan = fold_plan("accumulation+fused", 2);
  const Strategy strategy(plan);  // no listener set
  auto updater = make_updater(plan, model->parameters(), OptimizerSpec{"adam", 1e-3, 0.0, {}}, {});
  FoldPhases phases;
  const Batch batch = text_batch(1, 4, 9);
  EXPECT_THROW(updater->step(
                   [&] {
                     return strategy.compute_gradients(
                         *model, [&](int64_t) { return batch; }, phases);
                   },
                   phases),
               std::exception);
}

}  // namespace
}  // namespace gradscope
