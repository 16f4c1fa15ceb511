// What would have fitted a run that ran out of memory (train/fit_hint.h), held against the
// estimate itself: every method's flags give the configuration whose estimated peak it reports,
// the cheapest is the first that fits by the rule, the largest micro-batch fits and the next
// does not; combinations gradscope refuses are never offered.
#include "gradscope/train/fit_hint.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "gradscope/train/estimate.h"
#include "gradscope/train/trainer.h"
#include "test_util.h"

namespace gradscope {
namespace {

// The tiny Llama at a batch whose activations dominate its peak.
RunConfig fit_config() {
  RunConfig c = testing::tiny_llama_config();
  c.batch = 16;
  c.seq_len = 64;
  c.steps = 2;
  c.warmup_steps = 0;
  return c;
}

// A cap between the run's estimated peak and that of recomputing every block whole: the run
// does not fit, and at least one method does.
int64_t cap_between(const RunConfig& run) {
  RunConfig full = run;
  full.strategy.reset();
  full.recompute = Recompute::kFull;
  const int64_t peak = estimate_run(run, 0).peak_bytes;
  const int64_t lean = estimate_run(full, 0).peak_bytes;
  EXPECT_LT(lean, peak);
  return (peak + lean) / 2;
}

int rank_of(const std::string& cost) {
  const char* tiers[] = {"keeps the math and the compute", "recomputes",
                         "changes what is trained or its precision", "needs more devices"};
  for (int i = 0; i < 4; ++i)
    if (cost == tiers[i]) return i;
  ADD_FAILURE() << "unknown cost '" << cost << "'";
  return -1;
}

bool tried(const MemoryFit& fit, const std::string& flag, const std::string& value) {
  return std::any_of(fit.tried.begin(), fit.tried.end(), [&](const MemoryMethodFit& m) {
    for (size_t i = 0; i + 1 < m.flags.size(); i += 2)
      if (m.flags[i] == flag && m.flags[i + 1] == value) return true;
    return false;
  });
}

TEST(FitHint, EveryMethodIsTheEstimateOfItsFlags) {
  const RunConfig run = fit_config();
  const int64_t cap = cap_between(run);
  const MemoryFit fit = fit_within(run, 0, cap);
  EXPECT_EQ(fit.cap_bytes, cap);
  EXPECT_EQ(fit.estimated_peak_bytes, estimate_run(run, 0).peak_bytes);
  EXPECT_GT(fit.estimated_peak_bytes, cap);
  ASSERT_GE(fit.tried.size(), 10u);
  for (const MemoryMethodFit& m : fit.tried) {
    ASSERT_FALSE(m.flags.empty()) << m.method;
    const MemoryEstimate e = estimate_run(with_flags(run, m.flags), 0);
    EXPECT_EQ(e.peak_bytes, m.estimated_peak_bytes) << m.method;
    EXPECT_EQ(m.fits, m.estimated_peak_bytes <= cap) << m.method;
    EXPECT_EQ(m.recompute_flops_per_step.has_value(), e.recompute_flops_per_step > 0) << m.method;
  }
  // Each memory method gradscope has for this run is among them.
  EXPECT_TRUE(tried(fit, "--loss", "chunked"));
  EXPECT_TRUE(tried(fit, "--optimizer-step", "in-backward"));
  EXPECT_TRUE(tried(fit, "--recompute", "attention"));
  EXPECT_TRUE(tried(fit, "--recompute", "mlp"));
  EXPECT_TRUE(tried(fit, "--recompute", "full"));
  EXPECT_TRUE(tried(fit, "--optimizer", "adam8bit"));
  EXPECT_TRUE(tried(fit, "--lora-targets", "q,v"));
  for (const char* mode : {"zero1", "zero2", "fsdp"}) EXPECT_TRUE(tried(fit, "--shard", mode));
  for (const char* n : {"2", "4", "8"}) EXPECT_TRUE(tried(fit, "--nproc", n));
}

TEST(FitHint, TheCheapestIsTheFirstThatFitsByTheRule) {
  const RunConfig run = fit_config();
  const int64_t cap = cap_between(run);
  const MemoryFit fit = fit_within(run, 0, cap);
  ASSERT_TRUE(fit.cheapest.has_value());
  EXPECT_LE(estimate_run(with_flags(run, fit.cheapest->flags), 0).peak_bytes, cap);
  const auto first_fit = std::find_if(fit.tried.begin(), fit.tried.end(),
                                      [](const MemoryMethodFit& m) { return m.fits; });
  ASSERT_NE(first_fit, fit.tried.end());
  EXPECT_EQ(first_fit->method, fit.cheapest->method);
  EXPECT_EQ(first_fit->flags, fit.cheapest->flags);
  // Tiers in order, and within recomputation the fewest FLOPs run again first.
  for (size_t i = 1; i < fit.tried.size(); ++i) {
    const MemoryMethodFit& a = fit.tried[i - 1];
    const MemoryMethodFit& b = fit.tried[i];
    EXPECT_LE(rank_of(a.cost), rank_of(b.cost)) << a.method << " before " << b.method;
    if (a.cost == "recomputes" && b.cost == "recomputes")
      EXPECT_LE(*a.recompute_flops_per_step, *b.recompute_flops_per_step) << b.method;
  }
}

TEST(FitHint, TheLargestBatchFitsAndTheNextDoesNot) {
  RunConfig run = fit_config();
  const int64_t cap = cap_between(run);
  const MemoryFit fit = fit_within(run, 0, cap);
  ASSERT_GT(fit.max_batch, 0);
  EXPECT_LT(fit.max_batch, run.batch);  // the run itself does not fit
  run.batch = fit.max_batch;
  EXPECT_LE(estimate_run(run, 0).peak_bytes, cap);
  run.batch = fit.max_batch + 1;
  EXPECT_GT(estimate_run(run, 0).peak_bytes, cap);
}

TEST(FitHint, RefusedCombinationsAreNotOffered) {
  // Adagrad: its state takes no micro-batch fold, it has no 8-bit form, and the sharded modes
  // take it (elementwise).
  RunConfig run = fit_config();
  run.optimizer = "adagrad";
  run.accum_steps = 2;
  MemoryFit fit = fit_within(run, 0, cap_between(run));
  EXPECT_FALSE(tried(fit, "--optimizer-step", "in-backward"));
  EXPECT_FALSE(tried(fit, "--optimizer", "adam8bit"));
  EXPECT_TRUE(tried(fit, "--shard", "zero2"));
  // Muon updates the blocks' matrices whole: no zero or fsdp shard, and no LoRA.
  run = fit_config();
  run.optimizer = "muon";
  fit = fit_within(run, 0, cap_between(run));
  EXPECT_FALSE(tried(fit, "--shard", "zero1"));
  EXPECT_FALSE(tried(fit, "--shard", "fsdp"));
  EXPECT_FALSE(tried(fit, "--lora-targets", "q,v"));
  // Clipping rules out the step in backward; a chunked loss is not offered twice.
  run = fit_config();
  run.clip_grad_norm = 1;
  run.loss = LossKind::kChunked;
  fit = fit_within(run, 0, cap_between(run));
  EXPECT_FALSE(tried(fit, "--optimizer-step", "in-backward"));
  EXPECT_FALSE(tried(fit, "--loss", "chunked"));
}

TEST(FitHint, AStrategyNamedOnTheCommandLineIsNamedAgain) {
  // --strategy standard refuses --recompute alone: the flags name the strategy that does.
  RunConfig run = fit_config();
  run.strategy = parse_strategy("standard");
  const MemoryFit fit = fit_within(run, 0, cap_between(run));
  ASSERT_TRUE(tried(fit, "--strategy", "checkpoint"));
  for (const MemoryMethodFit& m : fit.tried)
    EXPECT_NO_THROW(with_flags(run, m.flags).step_plan()) << m.method;
  // Adam's micro-batches folded into its moments are another update rule: not the first tier.
  run = fit_config();
  run.accum_steps = 2;
  for (const MemoryMethodFit& m : fit_within(run, 0, cap_between(run)).tried)
    if (std::find(m.flags.begin(), m.flags.end(), "in-backward") != m.flags.end())
      EXPECT_EQ(m.cost, "changes what is trained or its precision") << m.method;
}

TEST(FitHint, TheRefusalKeepsTheLargestLabelsAndSumsTheRest) {
  MemoryRefusal refusal;
  refusal.requested_bytes = 100;
  refusal.live_bytes = 0;
  refusal.cap_bytes = 1000;
  refusal.request = {MemoryComponent::kActivations, "block 0 mlp", "forward"};
  // 15 labels of 1..15 bytes, smallest first: the 12 largest are kept, 1 + 2 + 3 summed.
  for (int64_t i = 1; i <= 15; ++i) {
    const MemoryComponent c = i % 2 ? MemoryComponent::kActivations : MemoryComponent::kParameters;
    refusal.live.push_back({{c, "module " + std::to_string(i), "forward"}, i});
    refusal.live_bytes += i;
  }
  const FailureMemory m = refusal_memory(refusal);
  EXPECT_EQ(*m.cap_bytes, 1000);
  EXPECT_EQ(*m.live_bytes, 120);
  EXPECT_EQ(m.request->bytes, 100);
  EXPECT_EQ(m.request->component, "activations");
  EXPECT_EQ(m.request->module, "block 0 mlp");
  ASSERT_EQ(m.live.size(), kFailureLiveLabels);
  EXPECT_EQ(m.live.front().bytes, 15);
  EXPECT_EQ(m.live.front().module, "module 15");
  EXPECT_EQ(m.live.back().bytes, 4);
  EXPECT_EQ(*m.live_rest_bytes, 1 + 2 + 3);
  ASSERT_EQ(m.live_by_component.size(), 2u);
  EXPECT_EQ(m.live_by_component[0].component, "activations");  // 1 + 3 + ... + 15 = 64
  EXPECT_EQ(m.live_by_component[0].bytes, 64);
  EXPECT_EQ(m.live_by_component[1].bytes, 56);
}

// A run that runs out of memory under a cap keeps the refusal and the estimate's answer.
TEST(FitHint, AnOomRecordKeepsWhyAndWhatWouldHaveFitted) {
  RunConfig c = fit_config();
  c.memory_cap_bytes = cap_between(c);
  const RunRecord r = Trainer(c).run();
  ASSERT_EQ(r.status, RunStatus::kOom) << (r.failure ? r.failure->message : "");
  ASSERT_TRUE(r.failure && r.failure->memory);
  const FailureMemory& m = *r.failure->memory;
  EXPECT_EQ(m.cap_bytes, c.memory_cap_bytes);
  ASSERT_TRUE(m.request && m.live_bytes);
  EXPECT_GT(*m.live_bytes + m.request->bytes, c.memory_cap_bytes);
  ASSERT_FALSE(m.live.empty());
  int64_t listed = *m.live_rest_bytes, by_component = 0;
  for (const MemoryLabelBytes& l : m.live) listed += l.bytes;
  for (const MemoryLabelBytes& l : m.live_by_component) by_component += l.bytes;
  EXPECT_EQ(listed, *m.live_bytes);
  EXPECT_EQ(by_component, *m.live_bytes);
  EXPECT_FALSE(m.reserved_peak_bytes.has_value());  // the CPU has no caching allocator
  ASSERT_TRUE(m.fit.has_value());
  EXPECT_EQ(m.fit->cap_bytes, c.memory_cap_bytes);
  EXPECT_TRUE(m.fit->cheapest.has_value());
}

}  // namespace
}  // namespace gradscope
