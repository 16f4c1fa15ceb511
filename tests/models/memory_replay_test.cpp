// The memory trace's replay of a checkpointed unit whose input is kept in bfloat16
// (--saved-input bf16), by hand.
#include <gtest/gtest.h>

#include "gradscope/models/common/memory_trace.h"

namespace gradscope {
namespace {

// x (48 bytes) -> block [linear(4 -> 4)] -> linear(4 -> 2) -> cross-entropy, 3 rows, the block
// checkpointed: it keeps x (48 bytes), or a bfloat16 copy of it (24) while x itself is freed.
TEST(MemoryTraceReplay, ACheckpointKeepsHalfItsInputInBf16) {
  MemoryTrace t;
  const auto x = t.alloc(3 * 4 * 4);
  t.begin(MemoryTrace::Unit::kBlock, x);
  const auto h = t.linear(x, 3, 4, 4, false);
  t.end(MemoryTrace::Unit::kBlock, h);
  t.release(x);
  const auto y = t.linear(h, 3, 4, 2, false);
  t.release(h);
  t.cross_entropy(y, 3, 2);
  t.release(y);
  MemoryTrace::Checkpointing ck;
  ck.enabled = true;
  const auto kept = t.replay(ck, false, true);
  ck.input_bf16 = true;
  const auto rounded = t.replay(ck, false, true);
  EXPECT_EQ(kept.saved_bytes - rounded.saved_bytes, 48 - 24);
  EXPECT_EQ(rounded.grads_bytes, kept.grads_bytes);
  // In backward the copy is widened back for the recompute: the input's bytes again, beside
  // the copy, while the block runs.
  EXPECT_GE(rounded.backward_peak, rounded.saved_bytes + 48);
}

}  // namespace
}  // namespace gradscope
