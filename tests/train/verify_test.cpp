#include <gtest/gtest.h>

#include <ATen/autocast_mode.h>

#include "gradscope/core/error.h"
#include "gradscope/strategy/checkpoint.h"
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
  const auto checks = verify_strategies(verify_config(), VerifyOptions{});
  // Every strategy but standard, checkpointing under its three policies, the folded
  // accumulations without and with weight decay; fp32, then bf16.
  ASSERT_EQ(checks.size(), 20u);
  std::vector<std::string> names;
  for (size_t i = 0; i < checks.size(); ++i) {
    const VerifyCheck& k = checks[i];
    const bool bf16 = k.dtype == Dtype::kBf16;
    EXPECT_EQ(bf16, i >= 10) << k.strategy;
    if (!bf16) names.push_back(k.strategy);
    EXPECT_TRUE(k.passed) << k.strategy << " " << dtype_name(k.dtype) << " worst " << k.worst_tensor
                          << " rel " << k.grad_max_rel_diff;
    EXPECT_GT(k.tensors, 0);
    EXPECT_EQ(k.missing_grads, 0);
    if (k.strategy.rfind("checkpoint", 0) == 0 && k.strategy.find('+') == std::string::npos) {
      // The bf16 criterion allows a reordered float32 sum (ModernBERT's tied embedding
      // needs it); on Llama the bf16 recompute is bitwise as well: it casts the weights as the
      // forward did.
      EXPECT_EQ(k.criterion, bf16 ? "relative <= 1e-05" : "bitwise");
      EXPECT_EQ(k.grad_max_abs_diff, 0.0);
    } else if (k.strategy == "fused") {
      // Parameters after one Adam step (the config's optimizer) against the unfused step.
      EXPECT_EQ(k.criterion, "params relative <= 1e-06");
      EXPECT_LE(k.grad_max_rel_diff, 1e-6);
    } else if (k.strategy.find("accumulation+fused") != std::string::npos) {
      EXPECT_EQ(k.criterion,
                bf16 ? "updates relative <= 0.02" : "params relative <= 1e-06, updates <= 0.02");
    } else {
      EXPECT_EQ(k.criterion, bf16 ? "relative <= 0.02" : "relative <= 1e-05");
    }
  }
  for (const char* name : {"checkpoint", "checkpoint (attention)", "checkpoint (mlp)"})
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
}

// A recompute that loses a weight's graph under bf16 (as a low-precision copy cast without a
// graph and reused from autocast's cache would) leaves that weight without a gradient. The
// loss and every other gradient are right, so only verify's bf16 run, which asks every
// parameter for its gradient, can catch it: the fp32 checks hold, the bf16 one fails and
// names the weight.
TEST(Verify, Bf16CatchesARecomputeThatLosesAWeightsGradient) {
  VerifyOptions options;
  options.strategies = {"checkpoint"};
  std::string lost;  // the weight the broken recompute detaches
  options.instrument = [&lost](Model& model, const StepPlan& plan) {
    if (plan.recompute != Recompute::kFull) return;
    auto first = model.blocks().front();
    for (const auto& p : first->named_parameters())
      if (p.key().find("weight") != std::string::npos && p.value().dim() == 2) {
        lost = p.key();
        break;
      }
    model.set_block_runner(RunnerLayer::kRecompute, [first, name = lost](
                                                        Block& block, const torch::Tensor& x,
                                                        const BlockContext& ctx,
                                                        const BlockRunner& /*inner*/) {
      Block* b = &block;
      const bool broken = b == first.get();
      return checkpoint_function(
          [b, ctx, broken, name](const torch::Tensor& in) {
            // Only the recompute under autocast: grad mode on, autocast on.
            const bool recompute = torch::GradMode::is_enabled() && at::autocast::is_autocast_enabled(at::kCPU);
            if (!broken || !recompute) return b->forward(in, ctx);
            torch::Tensor w = b->named_parameters()[name];
            w.requires_grad_(false);
            torch::Tensor out = b->forward(in, ctx);
            w.requires_grad_(true);
            return out;
          },
          x);
    });
  };
  const auto checks = verify_strategies(verify_config(), options);
  ASSERT_FALSE(lost.empty());
  // The three policies in fp32, then in bf16; only whole blocks are broken.
  ASSERT_EQ(checks.size(), 6u);
  for (const auto& k : checks) {
    const bool caught = k.dtype == Dtype::kBf16 && k.strategy == "checkpoint";
    EXPECT_EQ(k.passed, !caught) << k.strategy << " " << dtype_name(k.dtype) << " "
                                 << k.worst_tensor;
    if (!caught) continue;
    EXPECT_EQ(k.missing_grads, 1);
    EXPECT_NE(k.worst_tensor.find(lost), std::string::npos) << k.worst_tensor;
    EXPECT_LT(k.loss_abs_diff, 1e-6);  // the loss is right: only the gradient shows it
  }
}

TEST(Verify, DtypesCanBeChosen) {
  VerifyOptions options;
  options.strategies = {"accumulation"};
  options.dtypes = {Dtype::kBf16};
  const auto checks = verify_strategies(verify_config(), options);
  ASSERT_EQ(checks.size(), 1u);
  EXPECT_EQ(checks[0].dtype, Dtype::kBf16);
  EXPECT_TRUE(checks[0].passed) << checks[0].grad_max_rel_diff;
}

TEST(Verify, FusedSgdIsBitwise) {
  RunConfig c = verify_config();
  c.optimizer = "sgd";
  const auto checks = verify_strategies(c, {"fused"});
  ASSERT_EQ(checks.size(), 2u);  // fp32 and bf16, each bitwise
  EXPECT_EQ(checks[1].criterion, "params bitwise");
  EXPECT_TRUE(checks[1].passed);
  EXPECT_EQ(checks[1].grad_max_abs_diff, 0.0);
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
    const auto checks = verify_strategies(c, VerifyOptions{});
    ASSERT_EQ(checks.size(), 20u) << model;  // fp32, then bf16
    for (const auto& k : checks) {
      EXPECT_TRUE(k.passed) << model << " " << k.strategy << " " << dtype_name(k.dtype) << " worst "
                            << k.worst_tensor << " rel " << k.grad_max_rel_diff;
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
    const auto checks = verify_strategies(c, VerifyOptions{});
    // One checkpoint policy (there are no sub-layers), in fp32 and bf16.
    EXPECT_EQ(checks.size(), 16u) << model;
    for (const auto& k : checks) EXPECT_TRUE(k.passed) << model << " " << k.strategy;
  }
}

}  // namespace
}  // namespace gradscope

namespace gradscope {
namespace {

// The chunked loss (--loss chunked): standard and each strategy again with the loss taken
// over chunks of 37 positions (none of the tiny batches divides into them), each against the
// full-loss reference of its strategy's check, within the chunked tolerance on top of the
// strategy's own.
TEST(VerifyChunkedLoss, HoldsOnTinyLlama) {
  VerifyOptions options;
  options.strategies = {"checkpoint", "accumulation", "fused"};
  options.chunked_loss = true;
  const auto checks = verify_strategies(verify_config(), options);
  // Per dtype: checkpoint under three policies, accumulation, fused; then the chunked loss on
  // standard, checkpoint, accumulation, fused.
  ASSERT_EQ(checks.size(), 18u);
  std::vector<std::string> chunked;
  for (const auto& k : checks) {
    const bool bf16 = k.dtype == Dtype::kBf16;
    EXPECT_TRUE(k.passed) << k.strategy << " " << dtype_name(k.dtype) << " worst " << k.worst_tensor
                          << " rel " << k.grad_max_rel_diff;
    EXPECT_EQ(k.missing_grads, 0);
    if (k.strategy.find("loss chunked") == std::string::npos) continue;
    if (!bf16) chunked.push_back(k.strategy);
    // Never bitwise: the chunks reorder sums over positions. Yet it is not the reference
    // itself: some gradient differs.
    EXPECT_NE(k.criterion, "bitwise");
    EXPECT_GT(k.grad_max_abs_diff, 0.0) << k.strategy;
    if (k.strategy.rfind("standard", 0) == 0)
      EXPECT_EQ(k.criterion, bf16 ? "relative <= 0.02" : "relative <= 1e-05");
    if (k.strategy.rfind("accumulation", 0) == 0)
      EXPECT_EQ(k.criterion, bf16 ? "relative <= 0.04" : "relative <= 2e-05");
    if (k.strategy.rfind("fused", 0) == 0)
      EXPECT_EQ(k.criterion, bf16 ? "params relative <= 0.020001" : "params relative <= 1.1e-05");
  }
  EXPECT_EQ(chunked,
            (std::vector<std::string>{"standard, loss chunked 37", "checkpoint, loss chunked 37",
                                      "accumulation, loss chunked 37", "fused, loss chunked 37"}));
}

// --loss chunked in the configuration asks for the chunked checks, with its chunk; the other
// checks and the references keep the full loss (they are the same checks as without it).
TEST(VerifyChunkedLoss, TheConfigurationsChunkIsUsed) {
  RunConfig c = verify_config();
  c.loss = LossKind::kChunked;
  c.loss_chunk = 5;
  VerifyOptions options;
  options.strategies = {"accumulation"};
  options.dtypes = {Dtype::kFp32};
  const auto checks = verify_strategies(c, options);
  ASSERT_EQ(checks.size(), 3u);
  EXPECT_EQ(checks[0].strategy, "accumulation");
  EXPECT_EQ(checks[1].strategy, "standard, loss chunked 5");
  EXPECT_EQ(checks[2].strategy, "accumulation, loss chunked 5");
  for (const auto& k : checks) EXPECT_TRUE(k.passed) << k.strategy;
  // The full-loss check is the one verify makes without --loss chunked.
  const auto plain = verify_strategies(verify_config(), options);
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_EQ(plain[0].grad_max_abs_diff, checks[0].grad_max_abs_diff);
}

// A chunked head that loses the head weight's gradient (tied to the embedding: the weight
// then gets only the embedding's part) must fail every chunked check and no other. The loss
// is right; only the gradient shows it.
TEST(VerifyChunkedLoss, CatchesAChunkedHeadThatLosesTheWeightsGradient) {
  VerifyOptions options;
  options.strategies = {"checkpoint"};
  options.chunked_loss = true;
  options.instrument = [](Model& model, const StepPlan& plan) {
    if (plan.loss != LossKind::kChunked) return;
    LossOptions broken = model.loss_options();
    torch::Tensor weight = model.named_parameters()["embed_tokens.weight"];
    broken.head_probe = [weight](bool starts) mutable { weight.requires_grad_(!starts); };
    model.set_loss_options(broken);
  };
  const auto checks = verify_strategies(verify_config(), options);
  ASSERT_EQ(checks.size(), 10u);  // per dtype: three policies, then standard and checkpoint
  for (const auto& k : checks) {
    const bool chunked = k.strategy.find("loss chunked") != std::string::npos;
    EXPECT_EQ(k.passed, !chunked) << k.strategy << " " << dtype_name(k.dtype);
    if (!chunked) continue;
    EXPECT_EQ(k.worst_tensor, "embed_tokens.weight") << k.strategy;
    EXPECT_GT(k.grad_max_rel_diff, 0.1) << k.strategy;
    EXPECT_LT(k.loss_rel_diff, 1e-5) << k.strategy;
  }
}

// Models without a language-model head get no chunked checks, and asking for them by
// --loss chunked is a usage error.
TEST(VerifyChunkedLoss, ModelsWithoutALanguageModelHead) {
  RunConfig c;
  c.model = "quadratic";
  c.batch = 1;
  c.accum_steps = 2;
  VerifyOptions options;
  options.strategies = {"accumulation"};
  options.chunked_loss = true;
  EXPECT_EQ(verify_strategies(c, options).size(), 2u);
  c.loss = LossKind::kChunked;
  EXPECT_THROW(verify_strategies(c, options), Error);
}

// The other models with a language-model head: every chunked check holds in fp32 and bf16.
TEST(VerifyChunkedLoss, HoldsOnModernBertAndNanoVlm) {
  for (const std::string model : {"modernbert", "nanovlm"}) {
    RunConfig c;
    c.model = model;
    c.batch = 2;
    c.accum_steps = 3;
    c.eval_batches = 1;
    if (model == "modernbert") c.dataset = testing::fixture("text/sotu-excerpt.txt");
    VerifyOptions options;
    options.strategies = {"checkpoint+accumulation"};
    options.chunked_loss = true;
    const auto checks = verify_strategies(c, options);
    ASSERT_EQ(checks.size(), 6u) << model;  // per dtype: the strategy, standard and it chunked
    for (const auto& k : checks)
      EXPECT_TRUE(k.passed) << model << " " << k.strategy << " " << dtype_name(k.dtype) << " worst "
                            << k.worst_tensor << " rel " << k.grad_max_rel_diff;
  }
}

// --saved-input bf16: the lossy checkpoint holds its stated bound in both dtypes, is never
// reported bitwise, and its loss is the reference's (the forward ran on the exact input).
TEST(VerifySavedInput, HoldsItsBoundAndIsNotBitwise) {
  VerifyOptions options;
  options.strategies = {"checkpoint", "accumulation"};
  options.saved_input = true;
  const auto checks = verify_strategies(verify_config(), options);
  int found = 0;
  for (const auto& k : checks) {
    EXPECT_TRUE(k.passed) << k.strategy << " " << dtype_name(k.dtype) << " worst "
                          << k.worst_tensor << " rel " << k.grad_max_rel_diff;
    if (k.strategy != "checkpoint, saved input bf16") continue;
    ++found;
    EXPECT_EQ(k.criterion, k.dtype == Dtype::kBf16 ? "relative <= 0.02001" : "relative <= 0.02");
    EXPECT_GT(k.grad_max_rel_diff, 0.0);
    EXPECT_EQ(k.loss_abs_diff, 0.0);
  }
  EXPECT_EQ(found, 2);  // fp32 and bf16; accumulation has no checkpoint to round
  // Asked for by the configuration, the check runs without the option.
  RunConfig c = verify_config();
  c.saved_input = Dtype::kBf16;
  c.recompute = Recompute::kMlp;  // one policy: the mlp branch, exact and rounded
  VerifyOptions plain;
  plain.strategies = {"checkpoint"};
  plain.dtypes = {Dtype::kFp32};
  EXPECT_EQ(verify_strategies(c, plain).size(), 2u);
}

}  // namespace
}  // namespace gradscope
