// The losses of models/common/lm_loss.h against F::cross_entropy: the chunked cross-entropy
// against F::cross_entropy(F::linear(hidden, W, b)), the full path's cross_entropy_sum against
// F::cross_entropy of the logits, and the two paths in the three models with a language-model
// head.
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gradscope/measure/memory.h"
#include "gradscope/models/common/lm_loss.h"
#include "gradscope/models/llama.h"
#include "gradscope/models/modernbert.h"
#include "gradscope/models/nanovlm.h"
#include "gradscope/train/autocast.h"
#include "models/model_test_util.h"

namespace gradscope {
namespace {

namespace F = torch::nn::functional;
using testing::random_ids;
using testing::random_normal;

// Tolerances (docs/strategies.md, "The chunked loss"): per row the chunked path computes the
// full path's values; it sums over rows in another order (the loss, grad_W and grad_b: per
// chunk, then over chunks). In float32 that is a few units of 2^-24 times sqrt(rows);
// 1e-5 norm-wise leaves room for cancellation. Under bfloat16 each chunk's grad_W and grad_b
// are rounded to bfloat16 (2^-8 spacing) before their float32 sum, where the full path
// rounds the one sum: 2e-2 norm-wise, as accumulation's micro-batches.
constexpr double kChunkedFp32Tolerance = 1e-5;
constexpr double kChunkedBf16Tolerance = 2e-2;

// ||a - b|| / ||b||
double chunked_rel(const torch::Tensor& a, const torch::Tensor& b) {
  const auto a64 = a.detach().to(torch::kFloat64), b64 = b.detach().to(torch::kFloat64);
  return (a64 - b64).norm().item<double>() / b64.norm().item<double>();
}

// A head problem: hidden (N, C), weight (V, C), bias (V), targets (N) with every fifth row
// ignored. The weight is scaled so that the logits spread over a few units, as a trained
// head's do.
struct ChunkedHeadProblem {
  torch::Tensor hidden, weight, bias, targets;

  ChunkedHeadProblem(int64_t n, int64_t c, int64_t v, torch::Dtype dtype, uint64_t seed) {
    hidden = random_normal({n, c}, seed).to(dtype).requires_grad_(true);
    weight = (random_normal({v, c}, seed + 1) * 0.5).to(dtype).requires_grad_(true);
    bias = (random_normal({v}, seed + 2) * 0.1).to(dtype).requires_grad_(true);
    targets = random_ids(1, n, v, seed + 3).reshape({n});
    targets.index_put_({torch::arange(0, n, 5)}, kIgnoreIndex);
  }

  struct Result {
    torch::Tensor loss, grad_hidden, grad_weight, grad_bias;
  };

  // chunk_rows 0: the full path. The loss is backpropagated with gradient `scale` (not 1),
  // so a backward that dropped the incoming gradient would show.
  Result run(int64_t chunk_rows, bool with_bias, double scale = 1.5) {
    for (auto* t : {&hidden, &weight, &bias}) t->mutable_grad() = torch::Tensor();
    const torch::Tensor b = with_bias ? bias : torch::Tensor();
    torch::Tensor loss;
    if (chunk_rows == 0) {
      loss = F::cross_entropy(
          F::linear(hidden, weight, b), targets,
          F::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(kIgnoreIndex));
    } else {
      loss = chunked_cross_entropy(hidden, weight, b, targets, chunk_rows, kIgnoreIndex);
    }
    (loss * scale).backward();
    return {loss.detach(), hidden.grad().clone(), weight.grad().clone(),
            with_bias ? bias.grad().clone() : torch::Tensor()};
  }
};

// Chunks of one row, of sizes that do and do not divide N, of exactly N and of more than N.
const std::vector<int64_t> kChunkSizes = {1, 7, 25, 50, 103, 1000};

TEST(ChunkedCrossEntropy, MatchesTheFullPathInFp32) {
  ChunkedHeadProblem p(/*n=*/103, /*c=*/16, /*v=*/50, torch::kFloat, 1);
  for (const bool with_bias : {false, true}) {
    const auto full = p.run(0, with_bias);
    for (const int64_t chunk : kChunkSizes) {
      const auto got = p.run(chunk, with_bias);
      SCOPED_TRACE("chunk " + std::to_string(chunk) + (with_bias ? " with bias" : ""));
      EXPECT_EQ(got.loss.scalar_type(), torch::kFloat);
      EXPECT_LE(chunked_rel(got.loss, full.loss), kChunkedFp32Tolerance);
      EXPECT_LE(chunked_rel(got.grad_hidden, full.grad_hidden), kChunkedFp32Tolerance);
      EXPECT_LE(chunked_rel(got.grad_weight, full.grad_weight), kChunkedFp32Tolerance);
      if (with_bias) EXPECT_LE(chunked_rel(got.grad_bias, full.grad_bias), kChunkedFp32Tolerance);
      // Ignored rows take no part: their gradient is exactly zero.
      const auto ignored = p.targets.eq(kIgnoreIndex);
      EXPECT_EQ(got.grad_hidden.index({ignored}).abs().max().item<float>(), 0.0f);
    }
  }
}

// Under bfloat16 autocast the chunked path multiplies in bfloat16 and takes the softmax in
// float32, as autocast runs the full path: it agrees with the full bf16 path far more closely
// than either agrees with float32. The incoming gradient here is 2, which scales a bfloat16
// exactly, so that taking the gradients for 1 and scaling them after rounds as the full path
// does; with 1.5 each element of grad_logits is rounded once more (before the scaling rather
// than after), at most two units of bfloat16's rounding, 2 x 2^-8, apart.
TEST(ChunkedCrossEntropy, MatchesTheFullPathUnderBf16Autocast) {
  ChunkedHeadProblem p(/*n=*/103, /*c=*/64, /*v=*/300, torch::kFloat, 2);
  const auto fp32 = p.run(0, true, 2.0);
  AutocastScope autocast(torch::Device(torch::kCPU), /*enabled=*/true);
  const auto full = p.run(0, true, 2.0);
  // The rounding bfloat16 brings, which the chunked path must share.
  const double bf16_effect = chunked_rel(full.grad_weight, fp32.grad_weight);
  ASSERT_GT(bf16_effect, 5e-4);
  for (const int64_t chunk : kChunkSizes) {
    const auto got = p.run(chunk, true, 2.0);
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    EXPECT_EQ(got.loss.scalar_type(), torch::kFloat);
    EXPECT_EQ(got.grad_weight.scalar_type(), torch::kFloat);
    // The logits are the same bfloat16 products; the loss sums them in float32.
    EXPECT_LE(chunked_rel(got.loss, full.loss), kChunkedFp32Tolerance);
    EXPECT_LT(chunked_rel(got.loss, full.loss), chunked_rel(fp32.loss, full.loss) / 10);
    for (const auto& [got_t, full_t, fp32_t] :
         {std::tuple{got.grad_hidden, full.grad_hidden, fp32.grad_hidden},
          std::tuple{got.grad_weight, full.grad_weight, fp32.grad_weight},
          std::tuple{got.grad_bias, full.grad_bias, fp32.grad_bias}}) {
      EXPECT_LE(chunked_rel(got_t, full_t), kChunkedBf16Tolerance);
      EXPECT_LT(chunked_rel(got_t, full_t), chunked_rel(fp32_t, full_t) / 2);
    }
    // Each row's gradient is the full path's: the same bfloat16 grad_logits times W.
    EXPECT_LE(chunked_rel(got.grad_hidden, full.grad_hidden), 1e-3);
  }
  const auto full_15 = p.run(0, true, 1.5);
  for (const int64_t chunk : {int64_t{7}, int64_t{103}}) {
    const auto got = p.run(chunk, true, 1.5);
    SCOPED_TRACE("chunk " + std::to_string(chunk) + ", gradient 1.5");
    EXPECT_LE(chunked_rel(got.grad_hidden, full_15.grad_hidden), 2 * std::ldexp(1.0, -8));
    EXPECT_LE(chunked_rel(got.grad_weight, full_15.grad_weight), kChunkedBf16Tolerance);
  }
}

// Central differences in float64 against the Function's backward, every element of hidden,
// weight and bias, with a chunk that leaves a partial last chunk and an ignored row.
TEST(ChunkedCrossEntropy, GradientsMatchFiniteDifferencesInFloat64) {
  ChunkedHeadProblem p(/*n=*/7, /*c=*/3, /*v=*/5, torch::kDouble, 3);
  const auto got = p.run(3, true);
  EXPECT_EQ(got.loss.scalar_type(), torch::kDouble);
  const double eps = 1e-6;
  torch::NoGradGuard no_grad;
  const auto loss_at = [&] {
    return 1.5 * chunked_cross_entropy(p.hidden, p.weight, p.bias, p.targets, 3, kIgnoreIndex)
                     .item<double>();
  };
  int64_t checked = 0;
  for (const auto& [param, grad] :
       {std::pair{p.hidden, got.grad_hidden}, std::pair{p.weight, got.grad_weight},
        std::pair{p.bias, got.grad_bias}}) {
    auto flat = param.view({-1});
    auto g = grad.reshape({-1});
    for (int64_t i = 0; i < flat.numel(); ++i) {
      const double x = flat[i].item<double>();
      flat[i] = x + eps;
      const double up = loss_at();
      flat[i] = x - eps;
      const double down = loss_at();
      flat[i] = x;
      EXPECT_NEAR(g[i].item<double>(), (up - down) / (2 * eps), 1e-7) << i;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 7 * 3 + 5 * 3 + 5);
}

// The tracking allocator sees every CPU tensor: through forward and backward the chunked path
// never holds more than a small multiple of one chunk's logits, far below the whole batch's,
// which the full path does hold (the check that the meter would see them).
TEST(ChunkedCrossEntropy, NeverHoldsTheWholeBatchsLogits) {
  CpuMemoryTracker& tracker = CpuMemoryTracker::install();
  const int64_t n = 2048, c = 16, v = 2048, chunk = 64;
  ChunkedHeadProblem p(n, c, v, torch::kFloat, 4);
  const int64_t full_logits_bytes = n * v * static_cast<int64_t>(sizeof(float));  // 16 MiB
  const auto peak_of = [&](int64_t chunk_rows) {
    for (auto* t : {&p.hidden, &p.weight, &p.bias}) t->mutable_grad() = torch::Tensor();
    const int64_t before = tracker.current_bytes();
    tracker.reset_peak();
    {
      torch::Tensor loss =
          chunk_rows == 0
              ? F::cross_entropy(
                    F::linear(p.hidden, p.weight, p.bias), p.targets,
                    F::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(kIgnoreIndex))
              : chunked_cross_entropy(p.hidden, p.weight, p.bias, p.targets, chunk_rows,
                                      kIgnoreIndex);
      loss.backward();
    }
    return tracker.peak_bytes() - before;
  };
  const int64_t full_peak = peak_of(0);
  const int64_t chunked_peak = peak_of(chunk);
  EXPECT_GE(full_peak, full_logits_bytes);
  // One chunk's logits are 512 KiB; with the gradients of hidden, weight and bias (264 KiB)
  // and a few chunk-sized temporaries the peak stays under 1/4 of the whole batch's logits.
  EXPECT_LT(chunked_peak, full_logits_bytes / 4) << "full path: " << full_peak;
  EXPECT_LT(chunked_peak, 8 * chunk * v * static_cast<int64_t>(sizeof(float)));
}

TEST(ChunkedCrossEntropy, BadArgumentsAreRefused) {
  ChunkedHeadProblem p(4, 3, 5, torch::kFloat, 5);
  EXPECT_THROW(chunked_cross_entropy(p.hidden, p.weight, {}, p.targets, 0, kIgnoreIndex),
               c10::Error);
  EXPECT_THROW(chunked_cross_entropy(p.hidden, p.weight.t(), {}, p.targets, 2, kIgnoreIndex),
               c10::Error);
  EXPECT_THROW(
      chunked_cross_entropy(p.hidden, p.weight, p.bias.narrow(0, 0, 4), p.targets, 2, kIgnoreIndex),
      c10::Error);
}

// The gradients are taken in forward and handed on by the one backward: a second backward
// through the same loss is refused by name rather than given nothing.
// One backward through `loss` keeping its graph, then a second one, which must be refused.
void expect_second_backward_refused(const torch::Tensor& loss) {
  loss.backward({}, /*retain_graph=*/true);
  try {
    loss.backward();
    FAIL() << "a second backward ran";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("backward ran twice"), std::string::npos) << e.what();
  }
}

TEST(ChunkedCrossEntropy, ASecondBackwardIsRefused) {
  ChunkedHeadProblem p(9, 4, 6, torch::kFloat, 6);
  expect_second_backward_refused(
      chunked_cross_entropy(p.hidden, p.weight, p.bias, p.targets, 4, kIgnoreIndex));
}

// Backward hands forward's gradients on rather than copying them: once it has run, with the
// loss still alive, what stays allocated is the inputs' .grad and nothing more; a second
// backward through a graph built by backward (create_graph) is refused.
TEST(ChunkedCrossEntropy, BackwardHandsTheGradientsOn) {
  CpuMemoryTracker& tracker = CpuMemoryTracker::install();
  ChunkedHeadProblem p(256, 32, 4096, torch::kFloat, 9);
  const int64_t grads_bytes =
      (p.hidden.numel() + p.weight.numel() + p.bias.numel()) * static_cast<int64_t>(sizeof(float));
  const int64_t before = tracker.current_bytes();
  {
    torch::Tensor loss =
        chunked_cross_entropy(p.hidden, p.weight, p.bias, p.targets, 16, kIgnoreIndex);
    loss.backward();
    const int64_t after = tracker.current_bytes() - before;
    EXPECT_GE(after, grads_bytes);
    EXPECT_LT(after, grads_bytes + grads_bytes / 2) << "a copy of the gradients stayed behind";
  }
  torch::Tensor loss =
      chunked_cross_entropy(p.hidden, p.weight, p.bias, p.targets, 16, kIgnoreIndex);
  EXPECT_THROW(torch::autograd::grad({loss}, {p.hidden}, {}, /*retain_graph=*/true,
                                     /*create_graph=*/true),
               c10::Error);
}

// Only the inputs that require a gradient get one, and the others' are not computed at all:
// with the weight and bias frozen, or asked for hidden's gradient alone, hidden's is the full
// path's; under no_grad the call holds no more than one chunk's logits and its own scalars,
// nothing of the gradients' size.
TEST(ChunkedCrossEntropy, GradientsOnlyWhereAutogradAsks) {
  ChunkedHeadProblem p(103, 16, 50, torch::kFloat, 7);
  const auto full = p.run(0, true);
  p.weight.requires_grad_(false);
  p.bias.requires_grad_(false);
  for (auto* t : {&p.hidden, &p.weight, &p.bias}) t->mutable_grad() = torch::Tensor();
  chunked_cross_entropy(p.hidden, p.weight, p.bias, p.targets, 10, kIgnoreIndex)
      .mul(1.5)
      .backward();
  EXPECT_FALSE(p.weight.grad().defined());
  EXPECT_LE(chunked_rel(p.hidden.grad(), full.grad_hidden), kChunkedFp32Tolerance);
  p.weight.requires_grad_(true);
  p.bias.requires_grad_(true);
  const torch::Tensor loss =
      chunked_cross_entropy(p.hidden, p.weight, p.bias, p.targets, 10, kIgnoreIndex) * 1.5;
  const auto only_hidden = torch::autograd::grad({loss}, {p.hidden});
  EXPECT_LE(chunked_rel(only_hidden[0], full.grad_hidden), kChunkedFp32Tolerance);

  CpuMemoryTracker& tracker = CpuMemoryTracker::install();
  ChunkedHeadProblem big(256, 32, 4096, torch::kFloat, 8);
  const int64_t weight_bytes = big.weight.numel() * static_cast<int64_t>(sizeof(float));
  // The bytes above those before that `run` reaches at its peak.
  const auto peak_of = [&tracker](const auto& run) {
    const int64_t before = tracker.current_bytes();
    tracker.reset_peak();
    run();
    return tracker.peak_bytes() - before;
  };
  // One chunk's logits are 256 KiB, the weight's gradient would be 512 KiB.
  EXPECT_LT(peak_of([&] {
              torch::NoGradGuard no_grad;
              const torch::Tensor value = chunked_cross_entropy(big.hidden, big.weight, big.bias,
                                                                big.targets, 16, kIgnoreIndex);
              EXPECT_FALSE(value.requires_grad());
            }),
            weight_bytes);
  // With the weight and bias frozen, forward and backward make hidden's gradient (32 KiB)
  // and not the weight's.
  big.weight.requires_grad_(false);
  big.bias.requires_grad_(false);
  EXPECT_LT(peak_of([&] {
              chunked_cross_entropy(big.hidden, big.weight, big.bias, big.targets, 16, kIgnoreIndex)
                  .backward();
            }),
            weight_bytes);
  EXPECT_FALSE(big.weight.grad().defined());
}

// ---------------------------------------------------------------------------------------
// The full path's loss (cross_entropy_sum)

// F::cross_entropy on a copy of `logits` (the reference) and cross_entropy_sum on another,
// each backpropagated with gradient 1.5: the losses and the logits' gradients.
struct FullLossResult {
  torch::Tensor loss, grad;
};
FullLossResult full_loss(const torch::Tensor& logits, const torch::Tensor& targets,
                         bool reference) {
  const torch::Tensor leaf = logits.detach().clone().requires_grad_(true);
  const torch::Tensor x = leaf * 1.0;  // not a leaf, as the head's product is not
  const auto options =
      F::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(kIgnoreIndex);
  const torch::Tensor loss = reference ? F::cross_entropy(x, targets, options)
                                       : cross_entropy_sum(x, targets, kIgnoreIndex);
  (loss * 1.5).backward();
  return {loss.detach(), leaf.grad()};
}

// Per row the values are log_softmax's (its arithmetic in another order of a row's sum): the
// chunked loss's float32 tolerance. Blocks of rows: the small Llama's vocabulary gives ten
// rows a block, so 103 rows are eleven blocks, the last one short; 37 classes are one block.
TEST(CrossEntropySum, MatchesFCrossEntropyInFp32) {
  for (const int64_t v : {int64_t{50304}, int64_t{37}}) {
    SCOPED_TRACE("vocabulary " + std::to_string(v));
    const int64_t n = 103;
    const torch::Tensor logits = random_normal({n, v}, 40) * 3.0;
    torch::Tensor targets = random_ids(1, n, v, 41).reshape({n});
    targets.index_put_({torch::arange(0, n, 5)}, kIgnoreIndex);
    const auto want = full_loss(logits, targets, true);
    const auto got = full_loss(logits, targets, false);
    EXPECT_EQ(got.loss.scalar_type(), torch::kFloat);
    EXPECT_LE(chunked_rel(got.loss, want.loss), kChunkedFp32Tolerance);
    EXPECT_LE(chunked_rel(got.grad, want.grad), kChunkedFp32Tolerance);
    // Ignored rows take no part: their gradient is exactly zero.
    const auto ignored = targets.eq(kIgnoreIndex);
    EXPECT_EQ(got.grad.index({ignored}).abs().max().item<float>(), 0.0f);
    // Without a graph only the loss.
    torch::NoGradGuard no_grad;
    const torch::Tensor value = cross_entropy_sum(logits.clone(), targets, kIgnoreIndex);
    EXPECT_LE(chunked_rel(value, want.loss), kChunkedFp32Tolerance);
  }
}

// Logits that are not float32 take F::cross_entropy on a float32 copy: the same values, and
// the logits left as they were.
TEST(CrossEntropySum, OtherLogitsTakeFCrossEntropy) {
  const torch::Tensor logits = (random_normal({9, 11}, 42) * 2.0).to(torch::kBFloat16);
  const torch::Tensor targets = random_ids(1, 9, 11, 43).reshape({9});
  const torch::Tensor before = logits.clone();
  const torch::Tensor got = cross_entropy_sum(logits, targets, kIgnoreIndex);
  const torch::Tensor want = F::cross_entropy(logits.to(torch::kFloat), targets,
                                              F::CrossEntropyFuncOptions().reduction(torch::kSum));
  EXPECT_TRUE(torch::equal(got, want));
  EXPECT_TRUE(torch::equal(logits, before));
  // Float64 stays float64; strided float32 logits are left as they are.
  const torch::Tensor wide = random_normal({9, 11}, 47).to(torch::kDouble);
  const torch::Tensor wide_loss = cross_entropy_sum(wide, targets, kIgnoreIndex);
  EXPECT_EQ(wide_loss.scalar_type(), torch::kDouble);
  EXPECT_TRUE(torch::equal(
      wide_loss,
      F::cross_entropy(wide, targets, F::CrossEntropyFuncOptions().reduction(torch::kSum))));
  const torch::Tensor strided = random_normal({11, 9}, 48).t();
  const torch::Tensor strided_before = strided.clone();
  cross_entropy_sum(strided, targets, kIgnoreIndex);
  EXPECT_TRUE(torch::equal(strided, strided_before));
  EXPECT_THROW(cross_entropy_sum(logits.reshape({-1}), targets, kIgnoreIndex), c10::Error);
  EXPECT_THROW(cross_entropy_sum(logits, targets.narrow(0, 0, 8), kIgnoreIndex), c10::Error);
  // A leaf that requires a gradient would be overwritten: refused.
  EXPECT_THROW(cross_entropy_sum(random_normal({9, 11}, 49).requires_grad_(true), targets,
                                 kIgnoreIndex),
               c10::Error);
}

// The logits a model keeps for `gradscope outputs` are the logits, not what the loss made of
// them.
TEST(CrossEntropySum, KeptLogitsAreTheLogits) {
  auto model = make_llama(llama_preset("tiny"), 1);
  Batch batch;
  batch.input_ids = random_ids(2, 16, 320, 50);
  batch.targets = random_ids(2, 16, 320, 51);
  LossOptions options;
  options.keep_logits = true;
  model->set_loss_options(options);
  const LossOutput out = model->loss(batch);
  torch::NoGradGuard no_grad;
  auto& llama = dynamic_cast<LlamaModel&>(*model);
  EXPECT_TRUE(torch::allclose(out.logits, llama.logits(batch.input_ids), 1e-5, 1e-6));
}

// The tracking allocator sees every CPU tensor: from the head's product through backward the
// loss holds one tensor of the logits' size, where F::cross_entropy holds three at once in
// backward (its log-softmax, nll_loss's gradient and log_softmax's).
TEST(CrossEntropySum, HoldsOneTensorOfTheLogitsSize) {
  CpuMemoryTracker& tracker = CpuMemoryTracker::install();
  const int64_t n = 512, c = 8, v = 4096;
  ChunkedHeadProblem p(n, c, v, torch::kFloat, 44);
  const int64_t logits_bytes = n * v * static_cast<int64_t>(sizeof(float));  // 8 MiB
  const auto peak_of = [&](bool reference) {
    for (auto* t : {&p.hidden, &p.weight}) t->mutable_grad() = torch::Tensor();
    const int64_t before = tracker.current_bytes();
    tracker.reset_peak();
    {
      const torch::Tensor logits = F::linear(p.hidden, p.weight);
      const torch::Tensor loss =
          reference ? F::cross_entropy(logits, p.targets,
                                       F::CrossEntropyFuncOptions()
                                           .reduction(torch::kSum)
                                           .ignore_index(kIgnoreIndex))
                    : cross_entropy_sum(logits, p.targets, kIgnoreIndex);
      loss.backward();
    }
    return tracker.peak_bytes() - before;
  };
  const int64_t reference_peak = peak_of(true);
  const int64_t peak = peak_of(false);
  EXPECT_GE(reference_peak, 3 * logits_bytes);
  // The logits, the weight's gradient (128 KiB) and per-row scalars.
  EXPECT_LT(peak, logits_bytes + logits_bytes / 4) << "F::cross_entropy: " << reference_peak;
}

// The gradient is made in forward and handed on by the one backward: a second backward, or
// one that builds a graph, is refused by name.
TEST(CrossEntropySum, ASecondBackwardIsRefused) {
  const torch::Tensor leaf = random_normal({6, 5}, 45).requires_grad_(true);
  const torch::Tensor targets = random_ids(1, 6, 5, 46).reshape({6});
  expect_second_backward_refused(cross_entropy_sum(leaf * 1.0, targets, kIgnoreIndex));
  const torch::Tensor loss = cross_entropy_sum(leaf * 1.0, targets, kIgnoreIndex);
  EXPECT_THROW(torch::autograd::grad({loss}, {leaf}, {}, /*retain_graph=*/true,
                                     /*create_graph=*/true),
               c10::Error);
}

// ---------------------------------------------------------------------------------------
// In the models

// The loss and every gradient of `model` on `batch`, with the loss options given.
struct ChunkedModelStep {
  double loss = 0;
  std::vector<std::pair<std::string, torch::Tensor>> grads;
  std::vector<bool> probe_calls;  // the arguments head_probe was called with
};

ChunkedModelStep chunked_model_step(Model& model, const Batch& batch, bool chunked,
                                    int64_t chunk_rows, bool bf16 = false) {
  ChunkedModelStep r;
  LossOptions options;
  options.chunked = chunked;
  options.chunk_rows = chunk_rows;
  options.head_probe = [&r](bool starts) { r.probe_calls.push_back(starts); };
  model.set_loss_options(options);
  model.zero_grad();
  {
    AutocastScope autocast(torch::Device(torch::kCPU), bf16);
    const LossOutput out = model.loss(batch);
    r.loss = out.loss_sum.item<double>();
    out.loss_sum.backward();
  }
  // Copies: a zero_grad may zero the gradients in place.
  for (const auto& p : model.named_parameters()) {
    const torch::Tensor g = p.value().grad();
    r.grads.emplace_back(p.key(), g.defined() ? g.clone() : g);
  }
  return r;
}

// Chunked against full on one model: the loss and every gradient tensor within the tolerance,
// head_probe called once as the head starts and once when the loss exists, in both paths.
void expect_chunked_matches_full(Model& model, const Batch& batch, int64_t chunk_rows) {
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    const double tolerance = bf16 ? kChunkedBf16Tolerance : kChunkedFp32Tolerance;
    const auto full = chunked_model_step(model, batch, false, chunk_rows, bf16);
    const auto got = chunked_model_step(model, batch, true, chunk_rows, bf16);
    EXPECT_EQ(full.probe_calls, (std::vector<bool>{true, false}));
    EXPECT_EQ(got.probe_calls, (std::vector<bool>{true, false}));
    EXPECT_LE(std::fabs(got.loss - full.loss) / std::fabs(full.loss), kChunkedFp32Tolerance);
    ASSERT_EQ(got.grads.size(), full.grads.size());
    for (size_t i = 0; i < got.grads.size(); ++i) {
      ASSERT_TRUE(got.grads[i].second.defined()) << got.grads[i].first;
      // A gradient that is rounding noise in both (a key bias) is measured against 1.
      const double norm = full.grads[i].second.norm().item<double>();
      const double diff = (got.grads[i].second - full.grads[i].second).norm().item<double>();
      EXPECT_LE(diff / std::max(norm, 1e-3), tolerance) << got.grads[i].first;
    }
  }
  // Not in evaluation: the probe measures training forwards only.
  model.eval();
  LossOptions options;
  options.chunked = true;
  options.chunk_rows = chunk_rows;
  int calls = 0;
  options.head_probe = [&calls](bool) { ++calls; };
  model.set_loss_options(options);
  {
    torch::NoGradGuard no_grad;
    model.loss(batch);
  }
  EXPECT_EQ(calls, 0);
  model.train();
}

TEST(ChunkedLossInModels, LlamaMatchesTheFullLoss) {
  auto model = make_llama(llama_preset("tiny"), 1);
  EXPECT_TRUE(model->has_lm_head());
  Batch batch;
  batch.input_ids = random_ids(2, 24, 320, 20);
  batch.targets = random_ids(2, 24, 320, 21);
  batch.targets.index_put_({1, torch::indexing::Slice(20, 24)}, kIgnoreIndex);
  expect_chunked_matches_full(*model, batch, 13);
}

TEST(ChunkedLossInModels, NanoVlmMatchesTheFullLoss) {
  auto model = make_nanovlm(nanovlm_preset("tiny"), 2);
  EXPECT_TRUE(model->has_lm_head());
  Batch batch;
  batch.images = random_normal({2, 3, 32, 32}, 22);
  batch.input_ids = random_ids(2, 8, 256, 23);
  batch.targets = random_ids(2, 8, 256, 24);
  batch.targets.index_put_({1, torch::indexing::Slice(5, 8)}, kIgnoreIndex);
  expect_chunked_matches_full(*model, batch, 5);
}

TEST(ChunkedLossInModels, ModernBertMatchesTheFullLoss) {
  auto model = make_modernbert(modernbert_preset("tiny"), 3);
  EXPECT_TRUE(model->has_lm_head());
  Batch batch;
  batch.input_ids = random_ids(2, 24, 256, 25);
  batch.targets = torch::where(random_ids(2, 24, 3, 26).eq(0), random_ids(2, 24, 256, 27),
                               torch::full({2, 24}, kIgnoreIndex, torch::kLong));
  expect_chunked_matches_full(*model, batch, 4);
}

// head_logits is F::linear with the weight's gradient made as (V, C): the same values and
// gradients, on a 3-D input, with and without a bias, for a weight that is not the leaf
// (a view: the tied case's embedding is a leaf, but the product must not depend on it).
TEST(HeadLogits, MatchesFLinearWithItsGradients) {
  for (const auto dtype : {torch::kFloat64, torch::kFloat32}) {
    for (const bool with_bias : {false, true}) {
      const torch::Tensor hidden =
          random_normal({3, 5, 8}, 60).to(dtype).requires_grad_(true);  // (B, T, C)
      const torch::Tensor weight = random_normal({11, 8}, 61).to(dtype).requires_grad_(true);
      const torch::Tensor bias = random_normal({11}, 62).to(dtype).requires_grad_(true);
      const torch::Tensor g = random_normal({3, 5, 11}, 63).to(dtype);
      const torch::Tensor b = with_bias ? bias : torch::Tensor();
      const auto grads = [&](const torch::Tensor& out) {
        std::vector<torch::Tensor> inputs = {hidden, weight};
        if (with_bias) inputs.push_back(bias);
        return torch::autograd::grad({out}, inputs, {g});
      };
      const torch::Tensor want = F::linear(hidden, weight, b);
      const torch::Tensor got = head_logits(hidden, weight, b);
      ASSERT_EQ(got.sizes(), want.sizes());
      const double tol = dtype == torch::kFloat64 ? 1e-12 : 1e-6;
      EXPECT_LT(chunked_rel(got, want), tol);
      const auto want_grads = grads(want), got_grads = grads(got);
      ASSERT_EQ(got_grads.size(), want_grads.size());
      for (size_t i = 0; i < got_grads.size(); ++i) {
        EXPECT_LT(chunked_rel(got_grads[i], want_grads[i]), tol) << "input " << i;
        EXPECT_EQ(got_grads[i].sizes(), want_grads[i].sizes());
      }
      EXPECT_TRUE(got_grads[1].is_contiguous()) << "the weight's gradient, (V, C)";
    }
  }
}

// Gradients only for what requires one: a frozen weight gets none (and its product is not
// taken), and bfloat16 or autocast fall back to F::linear.
TEST(HeadLogits, FrozenWeightAndOtherDtypes) {
  const torch::Tensor hidden = random_normal({4, 6}, 64).requires_grad_(true);
  const torch::Tensor weight = random_normal({9, 6}, 65);
  head_logits(hidden, weight).sum().backward();
  EXPECT_FALSE(weight.grad().defined());
  EXPECT_LT(chunked_rel(hidden.grad(), torch::ones({4, 9}).mm(weight)), 1e-6);
  const torch::Tensor low = head_logits(hidden.to(torch::kBFloat16), weight.to(torch::kBFloat16));
  EXPECT_EQ(low.scalar_type(), torch::kBFloat16);
  AutocastScope autocast(torch::kCPU, true);
  EXPECT_EQ(head_logits(hidden, weight).scalar_type(), torch::kBFloat16);
}

// A head tied to an embedding: the engine sums the weight's two gradients in place, in the
// head's (V, C) one, so backward holds two tensors of the weight's size where F::linear's
// transposed gradient made it write their sum into a third.
TEST(HeadLogits, ATiedWeightsGradientsAreSummedInPlace) {
  CpuMemoryTracker& tracker = CpuMemoryTracker::install();
  const int64_t n = 16, c = 64, v = 16384;  // the weight 4 MiB, the logits 1 MiB
  const int64_t weight_bytes = v * c * static_cast<int64_t>(sizeof(float));
  const torch::Tensor weight = (random_normal({v, c}, 66) * 0.1).requires_grad_(true);
  const torch::Tensor ids = random_ids(1, n, v, 67).reshape({n});
  const torch::Tensor g = random_normal({n, v}, 68);  // the logits' gradient, made before
  const auto peak_of = [&](bool reference) {
    weight.mutable_grad() = torch::Tensor();
    const int64_t before = tracker.current_bytes();
    tracker.reset_peak();
    {
      const torch::Tensor hidden = F::embedding(ids, weight) * 1.0;  // (N, C)
      const torch::Tensor logits =
          reference ? F::linear(hidden, weight) : head_logits(hidden, weight);
      logits.backward(g);
    }
    // Above the gradient the step keeps.
    return tracker.peak_bytes() - before - weight_bytes;
  };
  const int64_t reference_peak = peak_of(true);
  const torch::Tensor want = weight.grad().clone();
  const int64_t peak = peak_of(false);
  EXPECT_LT(chunked_rel(weight.grad(), want), 1e-6);
  // F::linear: the head's gradient, the embedding's and their sum at once, with the logits.
  EXPECT_GE(reference_peak, 2 * weight_bytes);
  // head_logits: the embedding's gradient beside the head's, with the logits (1/4 of one).
  EXPECT_LT(peak, weight_bytes + weight_bytes / 2) << "F::linear: " << reference_peak;
}

}  // namespace
}  // namespace gradscope
