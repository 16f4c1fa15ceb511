// The `logits` part of memory: what a language model's loss head keeps for backward, as the
// trace predicts it (estimate) and as the trainer measures it (record), with the full and the
// chunked cross-entropy.
#include <gtest/gtest.h>

#include "gradscope/models/common/memory_trace.h"
#include "gradscope/train/trainer.h"
#include "test_util.h"

namespace gradscope {
namespace {

constexpr int64_t kRows = 64, kIn = 16, kVocab = 1000;

// x (kRows x kIn) -> head -> loss; returns the replay, of a training forward and backward or
// (with_grad false) of a forward under no_grad.
MemoryTrace::Replay head_only(int64_t chunk, bool with_grad = true) {
  MemoryTrace t;
  t.set_loss_chunk(chunk);
  const auto x = t.alloc(kRows * kIn * MemoryTrace::kFloat);
  t.node({}, {}, {x});
  t.begin_head();
  t.lm_loss(x, kRows, kIn, kVocab, /*bias=*/false, /*weight=*/-1);
  t.release(x);
  return t.replay({}, false, with_grad);
}

TEST(MemoryTraceHead, FullHeadKeepsTheLogitsOfEveryRow) {
  const auto r = head_only(0);
  // The logits (turned into their gradient in place) and the loss.
  const int64_t logits = kRows * kVocab * 4;
  EXPECT_EQ(r.head_saved_bytes, logits + 4);
  // x is not the head's (allocated before it starts), but the linear keeps it.
  EXPECT_EQ(r.saved_bytes, r.head_saved_bytes + kRows * kIn * 4);
  // Forward: x and the logits; nothing else of their size.
  EXPECT_EQ(r.forward_peak, kRows * kIn * 4 + logits + 4);
  // Backward hands the logits on as their gradient: then the gradients of x and the weight.
  EXPECT_EQ(r.backward_peak, kRows * kIn * 4 + logits + 4 + kRows * kIn * 4 + kVocab * kIn * 4);
}

TEST(MemoryTraceHead, ChunkedHeadKeepsTheGradientsAndOneChunkAtATime) {
  const auto full = head_only(0);
  const auto chunked = head_only(8);
  // The gradients of x and of the weight, taken in forward, and the loss; x itself is not
  // kept.
  const int64_t grads = kRows * kIn * 4 + kVocab * kIn * 4;
  EXPECT_EQ(chunked.head_saved_bytes, grads + 4);
  EXPECT_EQ(chunked.saved_bytes, chunked.head_saved_bytes);
  // Forward: x, the gradients, one chunk's logits and the chunk's rows of x's gradient.
  EXPECT_EQ(chunked.forward_peak, kRows * kIn * 4 + grads + 8 * kVocab * 4 + 8 * kIn * 4);
  // Of it, what is not kept: one chunk, a small part of the full head's logits.
  EXPECT_LT(chunked.forward_peak - kRows * kIn * 4 - grads, kRows * kVocab * 4 / 4);
  // Backward hands the gradients on: nothing is added to what forward kept but the loss's
  // own gradient.
  EXPECT_EQ(chunked.backward_peak, grads + 4 + 4);
  EXPECT_EQ(chunked.grads_bytes, full.grads_bytes);  // the same weight gets its gradient
  // A chunk longer than the rows is one chunk of all of them.
  EXPECT_EQ(head_only(kRows * 10).forward_peak, head_only(kRows).forward_peak);
  // Under no_grad only x, one chunk's logits and the loss.
  const auto no_grad = head_only(8, /*with_grad=*/false);
  EXPECT_EQ(no_grad.forward_peak, kRows * kIn * 4 + 8 * kVocab * 4);
  EXPECT_EQ(no_grad.head_saved_bytes, 4);
}

RunRecord tiny_run(const std::string& model, LossKind loss) {
  // The tiny presets on their own data sets, as the estimate's acceptance runs them.
  RunConfig c;
  c.model = model;
  c.preset = "tiny";
  c.quiet = true;
  c.sample_period_s = 0;
  c.steps = 1;
  c.warmup_steps = 1;
  c.eval_batches = 1;
  c.loss = loss;
  if (loss == LossKind::kChunked) c.loss_chunk = 32;
  return Trainer(c).run();
}

// The measured head bytes against the trace's (the `logits` part of the estimate), within 5%:
// the full head keeps its logits (their gradient, made in place), the rows x vocabulary floats
// the trace counts; the
// chunked one the gradients of its input and of the vocabulary matrix (and ModernBERT's
// dense layer and norm before it), which it computed in forward.
TEST(LogitsMemory, MeasuredHeadBytesAgreeWithTheEstimate) {
  for (const char* model : {"llama", "nanovlm", "modernbert"}) {
    const RunRecord full = tiny_run(model, LossKind::kFull);
    ASSERT_TRUE(full.ok() && full.memory && full.memory->logits_bytes) << model;
    const double estimated = full.estimate.at("logits_bytes").get<double>();
    const double measured = static_cast<double>(*full.memory->logits_bytes);
    EXPECT_NEAR(measured / estimated, 1.0, 0.05)
        << model << ": measured " << measured << ", estimated " << estimated;
    ASSERT_TRUE(full.memory->breakdown.logits.has_value()) << model;

    const RunRecord chunked = tiny_run(model, LossKind::kChunked);
    ASSERT_TRUE(chunked.ok() && chunked.memory && chunked.memory->logits_bytes) << model;
    const double chunked_estimated = chunked.estimate.at("logits_bytes").get<double>();
    const double chunked_measured = static_cast<double>(*chunked.memory->logits_bytes);
    EXPECT_NEAR(chunked_measured / chunked_estimated, 1.0, 0.05)
        << model << ": measured " << chunked_measured << ", estimated " << chunked_estimated;
    // The logits of every position are gone. At the tiny presets (small vocabularies, few
    // positions) the vocabulary matrix's gradient is of its order; at the small Llama's
    // (50304 tokens, 1024 positions) it is a quarter of it.
    EXPECT_LT(chunked_measured, measured) << model;
  }
}

TEST(LogitsMemory, NullWithoutALanguageModelHead) {
  const RunRecord r = tiny_run("vit", LossKind::kFull);
  ASSERT_TRUE(r.ok() && r.memory);
  EXPECT_FALSE(r.memory->logits_bytes.has_value());
  EXPECT_FALSE(r.memory->breakdown.logits.has_value());
}

}  // namespace
}  // namespace gradscope
