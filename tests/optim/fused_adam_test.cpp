// gradscope's Adam and AdamW step with ATen's fused kernels (optim/torch_optimizers.cpp): the
// same update, state and serialisation as LibTorch's torch::optim::Adam and AdamW, with
// parameter groups, parameters without gradients and learning rates changed between steps,
// to float64 and float32 rounding; LibTorch's own step for a parameter the kernel would update
// wrongly; bfloat16 parameters; and the memory rule against the allocations of measured steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gradscope/core/tensors.h"
#include "gradscope/measure/memory.h"
#include "gradscope/optim/factory.h"
#include "gradscope/optim/state_key.h"

namespace gradscope {
namespace {

// Agreement of the fused kernel with LibTorch's step on float64 values of order 1. The two
// round differently: the kernel moves m by a lerp (m + (1 - b1)(g - m)) where LibTorch
// multiplies and adds, and computes the denominator and the update in one expression where
// LibTorch rounds after each of its operations. Each step so differs by a few float64 ulps
// (2.2e-16 relative) in m, v and the parameter at most, and six steps add up at most a few
// tens of them: 1e-14 (measured: at most 2.5e-16, the test prints it). A wrong update
// (another step count, learning rate or decay) is off by 1e-4 or more.
constexpr double kFusedRtol = 1e-14;
constexpr double kFusedAtol = 1e-16;

// float64 parameters: a matrix and a vector in the first group, a 3-d tensor and a vector
// that never gets a gradient in the second.
std::vector<torch::Tensor> fused_adam_params() {
  auto gen = at::detail::createCPUGenerator(11);
  return {torch::randn({6, 5}, gen, torch::kFloat64).requires_grad_(true),
          torch::randn({5}, gen, torch::kFloat64).requires_grad_(true),
          torch::randn({2, 3, 4}, gen, torch::kFloat64).requires_grad_(true),
          torch::randn({4}, gen, torch::kFloat64).requires_grad_(true)};
}

std::vector<torch::Tensor> copies_of(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_(true));
  return out;
}

// The optimizer over the first two parameters, the others added as a second group at a tenth
// of the learning rate.
void add_second_group(torch::optim::Optimizer& optimizer, const std::vector<torch::Tensor>& p) {
  auto options = optimizer.param_groups()[0].options().clone();
  options->set_lr(options->get_lr() / 10);
  optimizer.add_param_group(torch::optim::OptimizerParamGroup({p[2], p[3]}, std::move(options)));
}

// LibTorch's own optimizer over `params` with the settings `built` (from the factory) was
// built with.
std::unique_ptr<torch::optim::Optimizer> libtorch_optimizer(
    const std::string& name, const torch::optim::Optimizer& built,
    const std::vector<torch::Tensor>& params) {
  if (name == "adamw")
    return std::make_unique<torch::optim::AdamW>(
        params, static_cast<const torch::optim::AdamWOptions&>(built.defaults()));
  return std::make_unique<torch::optim::Adam>(
      params, static_cast<const torch::optim::AdamOptions&>(built.defaults()));
}

// The same, over the two groups of add_second_group.
std::unique_ptr<torch::optim::Optimizer> libtorch_twin(const std::string& name,
                                                       const torch::optim::Optimizer& built,
                                                       const std::vector<torch::Tensor>& p) {
  auto out = libtorch_optimizer(name, built, {p[0], p[1]});
  add_second_group(*out, p);
  return out;
}

// Steps first..last-1 with seeded gradients for every parameter but the last, then scales
// every group's learning rate by 0.7, as a schedule sets it between steps.
void train_steps(torch::optim::Optimizer& optimizer, std::vector<torch::Tensor>& p, int first,
                 int last) {
  for (int i = first; i < last; ++i) {
    auto gen = at::detail::createCPUGenerator(100 + i);
    for (size_t k = 0; k + 1 < p.size(); ++k)
      p[k].mutable_grad() = torch::randn(p[k].sizes(), gen, torch::kFloat64);
    optimizer.step();
    for (auto& group : optimizer.param_groups())
      group.options().set_lr(group.options().get_lr() * 0.7);
  }
}

// The parameters agree within the kernel's rounding, and every parameter has the same step
// count in both (none for the one without a gradient).
void expect_same_run(const torch::optim::Optimizer& got, const std::vector<torch::Tensor>& a,
                     const torch::optim::Optimizer& want, const std::vector<torch::Tensor>& b,
                     const std::string& what) {
  double worst_rel = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    const double diff = (a[k] - b[k]).abs().max().item<double>();
    worst_rel = std::max(worst_rel, ((a[k] - b[k]).abs() / b[k].abs()).max().item<double>());
    EXPECT_TRUE(torch::allclose(a[k], b[k], kFusedRtol, kFusedAtol))
        << what << " parameter " << k << ": max |difference| " << diff;
    const auto got_state = got.state().find(param_state_key(a[k]));
    const auto want_state = want.state().find(param_state_key(b[k]));
    ASSERT_EQ(got_state == got.state().end(), want_state == want.state().end()) << what << k;
    if (want_state == want.state().end()) continue;
    // Adam's and AdamW's states are separate types with the same fields.
    const auto step_of = [](const torch::optim::OptimizerParamState& s) {
      if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(&s))
        return adam->step();
      return dynamic_cast<const torch::optim::AdamWParamState&>(s).step();
    };
    EXPECT_EQ(step_of(*got_state->second), step_of(*want_state->second)) << what << " " << k;
  }
  std::printf("FUSED %s: worst relative difference %.3g\n", what.c_str(), worst_rel);
}

struct FusedCase {
  std::string name;
  double weight_decay;
  OptSettings opt;
};

const std::vector<FusedCase>& fused_cases() {
  static const std::vector<FusedCase> cases = {
      {"adam", 0.0, {}},
      {"adam", 0.05, {{"amsgrad", "true"}, {"betas", "0.8,0.95"}}},
      {"adamw", 0.05, {}},
      {"adamw", 0.1, {{"amsgrad", "true"}, {"eps", "1e-6"}}},
  };
  return cases;
}

std::string case_name(const FusedCase& c) {
  return c.name + " wd " + std::to_string(c.weight_decay) + (c.opt.empty() ? "" : " amsgrad");
}

TEST(FusedAdam, MatchesLibTorchsStepWithGroupsSkipsAndScheduledRates) {
  for (const FusedCase& c : fused_cases()) {
    auto a = fused_adam_params();
    auto b = copies_of(a);
    auto fused = make_optimizer(c.name, {a[0], a[1]}, 0.02, c.weight_decay, c.opt);
    add_second_group(*fused, a);
    auto reference = libtorch_twin(c.name, *fused, b);
    train_steps(*fused, a, 0, 6);
    train_steps(*reference, b, 0, 6);
    expect_same_run(*fused, a, *reference, b, case_name(c));
    const auto start = fused_adam_params();
    EXPECT_FALSE(torch::equal(a[0], start[0])) << case_name(c);
    EXPECT_FALSE(torch::equal(a[2], start[2])) << case_name(c);
    EXPECT_TRUE(torch::equal(a[3], start[3])) << case_name(c) << ": no gradient, no update";
  }
}

// float32, as gradscope trains: three steps of the kernel and of LibTorch's step on parameters
// of order 1 agree to an ulp a step. Each step's update (about lr) differs by a few ulps of
// itself (1e-10), far below an ulp of the parameter (at most 2^-23 = 1.2e-7 of it), so the
// parameters differ only where p - update rounds to neighbours: rtol 4e-7 allows the three
// steps' ulps, atol 1e-9 the updates' own differences (measured: one ulp, in 54 and 57 of
// the 16,384 elements; the test prints it).
TEST(FusedAdam, Float32StepsAgreeWithLibTorchsToRounding) {
  for (const char* name : {"adam", "adamw"}) {
    auto gen = at::detail::createCPUGenerator(21);
    torch::Tensor a = torch::randn({256, 64}, gen).requires_grad_(true);
    torch::Tensor b = a.detach().clone().requires_grad_(true);
    auto fused = make_optimizer(name, {a}, 1e-3, 0.01, {});
    auto reference = libtorch_optimizer(name, *fused, {b});
    for (int i = 0; i < 3; ++i) {
      const torch::Tensor g = torch::randn({256, 64}, gen);
      a.mutable_grad() = g.clone();
      b.mutable_grad() = g.clone();
      fused->step();
      reference->step();
    }
    const double diff = (a - b).abs().max().item<double>();
    std::printf("FUSED %s float32: max |difference| %.3g, %lld of %lld elements differ\n", name,
                diff, static_cast<long long>((a != b).sum().item<int64_t>()),
                static_cast<long long>(a.numel()));
    EXPECT_TRUE(torch::allclose(a, b, 4e-7, 1e-9)) << name << ": max |difference| " << diff;
  }
}

// A state that LibTorch's Adam saved (as gradscope's did before its step was fused) resumes in
// gradscope's and continues as LibTorch's own run does, and a state that gradscope's saved
// resumes in LibTorch's: the state's tensors, names and step counts are LibTorch's.
TEST(FusedAdam, StateResumesAcrossLibTorchsOptimizerBothWays) {
  for (const FusedCase& c : fused_cases()) {
    for (const bool fused_saves : {false, true}) {
      auto a = fused_adam_params();
      auto fused = make_optimizer(c.name, {a[0], a[1]}, 0.02, c.weight_decay, c.opt);
      add_second_group(*fused, a);
      auto reference = libtorch_twin(c.name, *fused, a);
      // The saving run: 3 steps, then 3 more unbroken.
      auto& saver = fused_saves ? *fused : *reference;
      train_steps(saver, a, 0, 3);
      std::stringstream buffer;
      torch::save(saver, buffer);
      auto b = copies_of(a);
      auto loader_fused = make_optimizer(c.name, {b[0], b[1]}, 0.02, c.weight_decay, c.opt);
      add_second_group(*loader_fused, b);
      auto loader_reference = libtorch_twin(c.name, *loader_fused, b);
      auto& loader = fused_saves ? *loader_reference : *loader_fused;
      torch::load(loader, buffer);
      train_steps(saver, a, 3, 6);
      train_steps(loader, b, 3, 6);
      expect_same_run(loader, b, saver, a,
                      case_name(c) + (fused_saves ? " saved fused" : " saved by LibTorch"));
    }
  }
}

// A transposed parameter: the CPU kernel walks a parameter and its moments in memory order
// beside the gradient in index order, so it would give each element another's update
// (torch.optim's fused=True does so in torch 2.13). That optimizer takes LibTorch's step,
// bit for bit.
TEST(FusedAdam, StridedParameterTakesLibTorchsStep) {
  for (const char* name : {"adam", "adamw"}) {
    auto gen = at::detail::createCPUGenerator(3);
    const torch::Tensor start = torch::randn({5, 4}, gen, torch::kFloat64).t();
    torch::Tensor a = start.clone(torch::MemoryFormat::Preserve).requires_grad_(true);
    torch::Tensor b = start.clone(torch::MemoryFormat::Preserve).requires_grad_(true);
    ASSERT_FALSE(a.is_contiguous());
    auto fused = make_optimizer(name, {a}, 0.05, 0.1, {});
    auto reference = libtorch_optimizer(name, *fused, {b});
    for (int i = 0; i < 3; ++i) {
      const torch::Tensor g = torch::randn({4, 5}, gen, torch::kFloat64);
      a.mutable_grad() = g.clone();
      b.mutable_grad() = g.clone();
      fused->step();
      reference->step();
    }
    EXPECT_TRUE(torch::equal(a, b)) << name << ": max |difference| "
                                    << (a - b).abs().max().item<double>();
    EXPECT_FALSE(torch::equal(a, start)) << name;
  }
}

// bfloat16 parameters go through the kernel, which computes in float32 and rounds each
// result once to bfloat16: the first step lands within one bfloat16 rounding (2^-8 relative,
// 8 significant bits) of Adam's first update computed in float64 from the same bfloat16
// values, p - lr g / (|g| + eps), and so does the first moment, (1 - b1) g. The float32
// arithmetic before the rounding adds about 2^-24 of |p|: the absolute tolerance.
TEST(FusedAdam, Bfloat16StepRoundsOnce) {
  auto gen = at::detail::createCPUGenerator(9);
  torch::Tensor p = torch::randn({64, 16}, gen).to(torch::kBFloat16).requires_grad_(true);
  const torch::Tensor g = torch::randn({64, 16}, gen).to(torch::kBFloat16);
  const torch::Tensor p64 = p.detach().to(torch::kFloat64);
  const torch::Tensor g64 = g.to(torch::kFloat64);
  const double lr = 0.05, eps = 1e-8;
  auto optimizer = make_optimizer("adam", {p}, lr, 0, {});
  p.mutable_grad() = g.clone();
  optimizer->step();
  const torch::Tensor want = p64 - lr * g64 / (g64.abs() + eps);
  const torch::Tensor got = p.detach().to(torch::kFloat64);
  const double u = std::ldexp(1.0, -8);
  EXPECT_TRUE(((got - want).abs() <= u * want.abs() + 1e-6).all().item<bool>())
      << "max |difference| " << (got - want).abs().max().item<double>();
  EXPECT_FALSE(torch::equal(got, p64));
  const auto& state = static_cast<const torch::optim::AdamParamState&>(
      *optimizer->state().at(param_state_key(p)));
  EXPECT_EQ(state.exp_avg().scalar_type(), torch::kBFloat16);
  const torch::Tensor m = state.exp_avg().to(torch::kFloat64);
  EXPECT_TRUE(((m - 0.1 * g64).abs() <= u * (0.1 * g64).abs() + 1e-8).all().item<bool>())
      << "max |difference| " << (m - 0.1 * g64).abs().max().item<double>();
  EXPECT_EQ(state.step(), 1);
}

// The memory rule of Adam and AdamW against measured steps (the project's CPU allocator
// counts live bytes): the first step keeps the rule's state, and on every step the
// allocator's peak above what the step keeps is the rule's scratch.
TEST(OptimizerMemoryRule, AdamStepsAllocateWhatTheirRuleSays) {
  CpuMemoryTracker& tracker = CpuMemoryTracker::install();
  for (const FusedCase& c : fused_cases()) {
    std::vector<torch::Tensor> params = {torch::randn({64, 32}).requires_grad_(true),
                                         torch::randn({32}).requires_grad_(true),
                                         torch::randn({4, 5, 6}).requires_grad_(true)};
    std::vector<ParamExtent> extents;
    for (const auto& p : params)
      extents.push_back({tensors_bytes({p}), p.size(0), p.numel() / p.size(0), false});
    const OptimizerMemory rule = optimizer_registry().get(c.name).memory(
        MemoryRuleInput(extents, c.opt, c.weight_decay));
    auto optimizer = make_optimizer(c.name, params, 1e-3, c.weight_decay, c.opt);
    for (int step = 0; step < 3; ++step) {
      for (auto& p : params) p.mutable_grad() = torch::randn_like(p);
      const int64_t before = tracker.current_bytes();
      tracker.reset_peak();
      optimizer->step();
      const int64_t kept = tracker.current_bytes() - before;
      EXPECT_EQ(kept, step == 0 ? rule.state : 0) << case_name(c) << " step " << step;
      EXPECT_EQ(tracker.peak_bytes() - tracker.current_bytes(), rule.scratch)
          << case_name(c) << " step " << step;
    }
    EXPECT_GT(rule.scratch, 0);
  }
}

}  // namespace
}  // namespace gradscope
