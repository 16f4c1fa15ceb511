// The per-rank estimate of a run of several ranks (--nproc N --shard MODE) against the
// formulas of what each mode keeps on a rank (strategy/shard.cpp): a real run of several ranks
// needs processes, so the measured comparison is in the command's documentation, not here.
#include <gtest/gtest.h>

#include "gradscope/models/registry.h"
#include "gradscope/train/estimate.h"
#include "test_util.h"

namespace gradscope {
namespace {

RunConfig sharded_llama(Shard shard, int64_t nproc) {
  RunConfig c;
  c.model = "llama";
  c.preset = "tiny";
  c.batch = 4;
  c.nproc = nproc;
  c.shard = shard;
  return c;
}

// Trainable parameter elements of tiny llama (P), and those of each block.
struct LlamaCounts {
  int64_t total = 0, outside_blocks = 0;
  std::vector<int64_t> blocks;
};
LlamaCounts llama_counts() {
  const RunConfig c = sharded_llama(Shard::kNone, 1);
  MemoryTrace trace;
  model_registry().get("llama").trace_step(resolve_arch(c), c.batch, trace);
  LlamaCounts n;
  for (const auto& p : trace.trainable_param_shapes()) {
    const int64_t e = p.bytes / MemoryTrace::kFloat;
    n.total += e;
    if (p.block < 0) {
      n.outside_blocks += e;
      continue;
    }
    if (n.blocks.size() <= static_cast<size_t>(p.block))
      n.blocks.resize(static_cast<size_t>(p.block) + 1);
    n.blocks[static_cast<size_t>(p.block)] += e;
  }
  return n;
}

int64_t largest_param() {
  const RunConfig c = sharded_llama(Shard::kNone, 1);
  MemoryTrace trace;
  model_registry().get("llama").trace_step(resolve_arch(c), c.batch, trace);
  int64_t most = 0;
  for (const auto& p : trace.trainable_param_shapes()) most = std::max(most, p.bytes);
  return most;
}

int64_t steady_bytes(const MemoryEstimate& e) {
  return e.params_bytes + e.optimizer_state_bytes + e.batch_bytes + e.data_bytes;
}

TEST(EstimateShard, OneRankOrNoShardIsOneProcess) {
  const MemoryEstimate one = estimate_run(sharded_llama(Shard::kNone, 1), 0);
  EXPECT_FALSE(one.sharded);
  for (Shard s : {Shard::kDdp, Shard::kZero1, Shard::kZero2, Shard::kFsdp}) {
    const MemoryEstimate e = estimate_run(sharded_llama(s, 1), 0);
    EXPECT_FALSE(e.sharded) << shard_name(s);
    EXPECT_EQ(e.peak_bytes, one.peak_bytes) << shard_name(s);
    EXPECT_EQ(e.optimizer_state_bytes, one.optimizer_state_bytes) << shard_name(s);
    EXPECT_EQ(e.notes, one.notes) << shard_name(s);
  }
}

TEST(EstimateShard, DdpKeepsEverythingAndAddsTheBuckets) {
  const MemoryEstimate one = estimate_run(sharded_llama(Shard::kNone, 1), 0);
  const MemoryEstimate e = estimate_run(sharded_llama(Shard::kDdp, 2), 0);
  ASSERT_TRUE(e.sharded);
  EXPECT_EQ(e.params_bytes, one.params_bytes);
  EXPECT_EQ(e.grads_bytes, one.grads_bytes);
  EXPECT_EQ(e.optimizer_state_bytes, one.optimizer_state_bytes);
  EXPECT_EQ(e.activations_bytes, one.activations_bytes);  // the same micro-batch
  // Every bucket's buffer lives until backward ends: as many bytes as the gradients.
  EXPECT_EQ(e.collective_buffers_bytes, one.grads_bytes);
  EXPECT_EQ(e.comm_peak_bytes, steady_bytes(one) + 2 * one.grads_bytes);
  // One 25 MiB bucket holds tiny llama: its buffer is made as backward ends, beside every
  // gradient.
  EXPECT_GE(e.backward_peak_bytes, steady_bytes(one) + 2 * one.grads_bytes);
  EXPECT_GE(e.peak_bytes, one.peak_bytes);
  EXPECT_LE(e.peak_bytes, one.peak_bytes + e.collective_buffers_bytes);
  EXPECT_EQ(e.flat_elements, llama_counts().total);
  EXPECT_EQ(e.shard_elements, e.flat_elements);
}

TEST(EstimateShard, ZeroOneHalvesTheOptimizerState) {
  const int64_t P = llama_counts().total, S = (P + 1) / 2;
  const MemoryEstimate one = estimate_run(sharded_llama(Shard::kNone, 1), 0);
  const MemoryEstimate e = estimate_run(sharded_llama(Shard::kZero1, 2), 0);
  ASSERT_TRUE(e.sharded);
  // Adam: two moments per element of the rank's shard.
  EXPECT_EQ(one.optimizer_state_bytes, 2 * P * 4);
  EXPECT_EQ(e.optimizer_state_bytes, 2 * S * 4);
  EXPECT_EQ(e.grads_bytes, one.grads_bytes);  // every gradient stays whole
  EXPECT_EQ(e.params_bytes, one.params_bytes);
  EXPECT_EQ(e.shard_elements, S);
  EXPECT_EQ(e.backward_peak_bytes - one.backward_peak_bytes,
            e.optimizer_state_bytes - one.optimizer_state_bytes);
  // The parameters' all-gather after the update: chunks of 25 MiB / 4 / 2 elements, more than
  // the shard, so one chunk of S: the rank's and 2 received (the buffers), and Gloo's output.
  EXPECT_EQ(e.collective_buffers_bytes, std::max(P * 4, 3 * S * 4));
  EXPECT_GE(e.comm_peak_bytes, steady_bytes(e) + 5 * S * 4);
}

TEST(EstimateShard, ZeroTwoKeepsTheGradientShard) {
  const int64_t all = llama_counts().total;
  for (int64_t n : {2, 3, 8}) {
    const int64_t S = (all + n - 1) / n;
    RunConfig c = sharded_llama(Shard::kZero2, n);
    c.log_grad_norm = false;
    const MemoryEstimate e = estimate_run(c, 0);
    ASSERT_TRUE(e.sharded);
    EXPECT_EQ(e.grads_bytes, S * 4) << n;
    EXPECT_EQ(e.optimizer_state_bytes, 2 * S * 4) << n;
    EXPECT_EQ(e.optimizer_peak_bytes, steady_bytes(e) + S * 4 + e.optimizer_scratch_bytes) << n;
    // The gradient norm's float64 copy of a piece and its square: the embedding's at N = 2.
    c.log_grad_norm = true;
    if (n == 2)
      EXPECT_EQ(estimate_run(c, 0).optimizer_peak_bytes,
                steady_bytes(e) + S * 4 + std::max(e.optimizer_scratch_bytes, 4 * largest_param()));
  }
  // Gradients go as they are copied into the buckets: never more than zero1 holds. With
  // small buckets (so the all-gather's chunks are small too), the drain after backward is the
  // communication's peak.
  RunConfig c1 = sharded_llama(Shard::kZero1, 2), c2 = sharded_llama(Shard::kZero2, 2);
  c1.bucket_bytes = c2.bucket_bytes = 64 << 10;
  const MemoryEstimate z1 = estimate_run(c1, 0), z2 = estimate_run(c2, 0);
  const int64_t P = llama_counts().total;
  EXPECT_LE(z2.peak_bytes, z1.peak_bytes);
  // zero1: the whole gradients and the buckets' copies (a bucket of one parameter reduces in
  // place); zero2: at most two buckets still in flight beside the shard.
  EXPECT_GE(z1.comm_peak_bytes, steady_bytes(z1) + P * 4);
  EXPECT_LE(z1.comm_peak_bytes, steady_bytes(z1) + 2 * P * 4);
  EXPECT_GE(z2.comm_peak_bytes, steady_bytes(z2) + (P + 1) / 2 * 4);
  EXPECT_LE(z2.comm_peak_bytes, steady_bytes(z2) + (P + 1) / 2 * 4 + 2 * largest_param());
  EXPECT_LT(z2.comm_peak_bytes, z1.comm_peak_bytes);
}

TEST(EstimateShard, FsdpShardsTheBlocksParameters) {
  const LlamaCounts n = llama_counts();
  ASSERT_FALSE(n.blocks.empty());
  const int64_t N = 2;
  int64_t blocks_shard = 0, largest_unit = 0;
  for (int64_t b : n.blocks) {
    blocks_shard += (b + N - 1) / N;
    largest_unit = std::max(largest_unit, N * ((b + N - 1) / N));
  }
  const int64_t outside_shard = (n.outside_blocks + N - 1) / N;
  const MemoryEstimate one = estimate_run(sharded_llama(Shard::kNone, 1), 0);
  const MemoryEstimate e = estimate_run(sharded_llama(Shard::kFsdp, N), 0);
  ASSERT_TRUE(e.sharded);
  EXPECT_EQ(e.params_bytes, (n.outside_blocks + blocks_shard) * 4);
  EXPECT_EQ(e.grads_bytes, (outside_shard + blocks_shard) * 4);
  EXPECT_EQ(e.optimizer_state_bytes, 2 * (outside_shard + blocks_shard) * 4);
  // A block is gathered whole for its forward.
  EXPECT_GE(e.collective_buffers_bytes, largest_unit * 4);
  EXPECT_GE(e.forward_peak_bytes, steady_bytes(e) + one.activations_bytes);
  EXPECT_LT(e.peak_bytes, estimate_run(sharded_llama(Shard::kZero2, N), 0).peak_bytes);
}

// Gloo's reduce-scatter copies the unit's flat buffer it reduces: one unit more of collective
// buffers on the CPU, none with one rank alone (no transport).
TEST(EstimateShard, FsdpReduceScatterCountsGloosCopy) {
  const LlamaCounts n = llama_counts();
  const int64_t N = 2;
  int64_t largest_unit = 0;
  for (int64_t b : n.blocks) largest_unit = std::max(largest_unit, N * ((b + N - 1) / N));
  RunConfig scatter = sharded_llama(Shard::kFsdp, N);
  scatter.grad_reduce = GradReduce::kReduceScatter;
  const MemoryEstimate whole = estimate_run(sharded_llama(Shard::kFsdp, N), 0);
  const MemoryEstimate e = estimate_run(scatter, 0);
  EXPECT_GE(e.collective_buffers_bytes, whole.collective_buffers_bytes + largest_unit * 4);
  EXPECT_GE(e.peak_bytes, whole.peak_bytes);
  RunConfig alone = sharded_llama(Shard::kFsdp, 1);
  alone.grad_reduce = GradReduce::kReduceScatter;
  EXPECT_EQ(estimate_run(alone, 0).peak_bytes,
            estimate_run(sharded_llama(Shard::kFsdp, 1), 0).peak_bytes);
}

TEST(EstimateShard, AccumulationReducesOnlyTheLastMicroBatch) {
  RunConfig c = sharded_llama(Shard::kZero2, 2);
  c.accum_steps = 4;
  const MemoryEstimate e = estimate_run(c, 0);
  ASSERT_TRUE(e.sharded);
  const int64_t P = llama_counts().total;
  // The earlier micro-batches keep whole gradients: later ones run beside them.
  EXPECT_GE(e.backward_peak_bytes, steady_bytes(e) + P * 4 + e.activations_bytes);
  EXPECT_EQ(e.grads_bytes, (P + 1) / 2 * 4);
}

TEST(EstimateShard, RefusedCombinationsAreNotedNotModelled) {
  RunConfig c = sharded_llama(Shard::kZero1, 2);
  c.optimizer = "muon";
  RunConfig single = c;
  single.nproc = 1;
  single.shard = Shard::kNone;
  const MemoryEstimate e = estimate_run(c, 0);
  EXPECT_FALSE(e.sharded);
  EXPECT_EQ(e.peak_bytes, estimate_run(single, 0).peak_bytes);
  bool noted = false;
  for (const auto& note : e.notes) noted |= note.find("not modelled") != std::string::npos;
  EXPECT_TRUE(noted);
  EXPECT_FALSE(estimate_to_json(e).contains("per_rank"));
  // ddp takes it.
  c.shard = Shard::kDdp;
  EXPECT_TRUE(estimate_run(c, 0).sharded);
}

TEST(EstimateShard, JsonCarriesThePerRankFigures) {
  const MemoryEstimate e = estimate_run(sharded_llama(Shard::kZero2, 2), 0);
  const nlohmann::json j = estimate_to_json(e);
  EXPECT_EQ(j.at("per_rank").at("nproc"), 2);
  EXPECT_EQ(j.at("per_rank").at("shard"), "zero2");
  EXPECT_EQ(j.at("per_rank").at("shard_params"), e.shard_elements);
  EXPECT_EQ(j.at("collective_buffers_bytes"), e.collective_buffers_bytes);
  EXPECT_EQ(j.at("phase_peak_bytes").at("communication"), e.comm_peak_bytes);
  EXPECT_EQ(j.at("peak_bytes"), e.peak_bytes);
}

TEST(EstimateShard, MaxBatchIsPerRank) {
  RunConfig c = sharded_llama(Shard::kZero2, 4);
  const int64_t budget = estimate_run(sharded_llama(Shard::kNone, 1), 0).peak_bytes * 2;
  const int64_t b = max_batch_within(c, 0, budget);
  ASSERT_GT(b, 0);
  c.batch = b;
  EXPECT_LE(estimate_run(c, 0).peak_bytes, budget);
  c.batch = b + 1;
  EXPECT_GT(estimate_run(c, 0).peak_bytes, budget);
  // A rank keeps a quarter of the state: its micro-batch is at least one process's.
  RunConfig one = sharded_llama(Shard::kNone, 1);
  EXPECT_GE(b, max_batch_within(one, 0, budget));
}

// The replay tells an overlay where it is: every block in order in the forward and in reverse
// in the backward, and every trainable parameter's gradient once.
class RecordingOverlay : public MemoryTrace::Overlay {
 public:
  int64_t enter_block(int64_t block, bool backward) override {
    if (block >= 0) (backward ? backward_blocks : forward_blocks).push_back(block);
    return bytes();
  }
  int64_t gradient_done(int param) override {
    done.push_back(param);
    return bytes();
  }
  int64_t bytes() const override { return held; }
  std::vector<int64_t> forward_blocks, backward_blocks;
  std::vector<int> done;
  int64_t held = 0;
};

TEST(EstimateShard, ReplayTellsTheOverlayBlocksAndGradients) {
  const RunConfig c = sharded_llama(Shard::kNone, 1);
  MemoryTrace trace;
  model_registry().get("llama").trace_step(resolve_arch(c), 2, trace);
  const int64_t L = trace.block_count();
  ASSERT_GT(L, 1);
  for (bool recompute : {false, true}) {
    MemoryTrace::Checkpointing ck;
    ck.enabled = recompute;
    RecordingOverlay o;
    const auto plain = trace.replay(ck, false, true);
    o.held = 1000;
    const auto r = trace.replay(ck, false, true, &o);
    std::vector<int64_t> up, down;
    for (int64_t b = 0; b < L; ++b) {
      up.push_back(b);
      down.push_back(L - 1 - b);
    }
    EXPECT_EQ(o.forward_blocks, up) << recompute;
    EXPECT_EQ(o.backward_blocks, down) << recompute;
    std::vector<int> done = o.done;
    std::sort(done.begin(), done.end());
    ASSERT_EQ(done.size(), trace.trainable_param_shapes().size()) << recompute;
    for (size_t i = 0; i < done.size(); ++i) EXPECT_EQ(done[i], static_cast<int>(i));
    // What the overlay holds adds to every moment.
    EXPECT_EQ(r.forward_peak, plain.forward_peak + 1000) << recompute;
    EXPECT_EQ(r.backward_peak, plain.backward_peak + 1000) << recompute;
  }
}

}  // namespace
}  // namespace gradscope
