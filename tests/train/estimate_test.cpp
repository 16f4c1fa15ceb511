// `gradscope estimate` against the model of each architecture and against measurement: the
// trace counts every parameter, and the predicted peak lies close to the measured one.
#include <gtest/gtest.h>

#include "gradscope/models/registry.h"
#include "gradscope/train/estimate.h"
#include "gradscope/train/trainer.h"
#include "test_util.h"

namespace gradscope {
namespace {

const char* const kModels[] = {"llama", "modernbert", "nanovlm", "vit"};

TEST(MemoryTraceModels, CountEveryParameterOfTheArchitecture) {
  for (const char* model : kModels) {
    for (const char* preset : {"tiny", "small", "paper"}) {
      RunConfig c;
      c.model = model;
      c.preset = preset;
      const auto arch = resolve_arch(c);
      const ModelFamily& family = model_registry().get(model);
      MemoryTrace trace;
      family.trace_step(arch, 2, trace);
      EXPECT_EQ(trace.params_bytes(), family.count_params(arch) * MemoryTrace::kFloat)
          << model << " " << preset;
    }
  }
}

TEST(MemoryTraceReplay, ClosedFormTwoLayerChain) {
  // x -> linear(4 -> 8) -> activation -> linear(8 -> 2) -> cross-entropy, 3 rows.
  MemoryTrace t;
  const auto x = t.persistent(3 * 4 * 4);
  const auto h = t.linear(x, 3, 4, 8, false);  // 96 bytes; saves x (persistent)
  const auto a = t.activation(h);              // 96 bytes; saves h
  t.release(h);
  const auto y = t.linear(a, 3, 8, 2, false);  // 24 bytes; saves a
  t.release(a);
  t.cross_entropy(y, 3, 2);  // log-probs 24 bytes (saved), loss 4
  t.release(y);
  const auto r = t.replay({}, false, true);
  // Saved when the forward ends: h, a, log-probs and the loss.
  EXPECT_EQ(r.saved_bytes, 96 + 96 + 24 + 4);
  // Parameters' gradients: 4x8 and 8x2 floats.
  EXPECT_EQ(r.grads_bytes, (32 + 16) * 4);
  // Most at once in the forward: everything, y and the log-probs included.
  EXPECT_EQ(r.forward_peak, 96 + 96 + 24 + 24 + 4);
  EXPECT_GE(r.backward_peak, r.saved_bytes);
  // Without a graph nothing is saved: the peak is the widest moment.
  EXPECT_LT(t.replay({}, false, false).forward_peak, r.forward_peak);
}

TEST(MemoryTraceReplay, CheckpointingKeepsOnlyBlockInputs) {
  RunConfig c;
  c.model = "llama";
  c.preset = "tiny";
  const auto arch = resolve_arch(c);
  MemoryTrace trace;
  model_registry().get("llama").trace_step(arch, 8, trace);
  MemoryTrace::Checkpointing ck;
  ck.enabled = true;
  const auto plain = trace.replay({}, false, true);
  const auto wrapped = trace.replay(ck, false, true);
  EXPECT_LT(wrapped.saved_bytes, plain.saved_bytes);
  EXPECT_EQ(wrapped.grads_bytes, plain.grads_bytes);  // the same gradients either way
  ck.every = 2;                                       // every other block: in between
  const auto half = trace.replay(ck, false, true);
  EXPECT_GT(half.saved_bytes, wrapped.saved_bytes);
  EXPECT_LT(half.saved_bytes, plain.saved_bytes);
}

// The acceptance of the estimate at the tiny presets, where temporaries weigh most: within
// 25% of the measured peak for every model and strategy (docs/metrics.md has the table).
TEST(EstimateAgainstMeasurement, TinyPresetsWithinTwentyFivePercent) {
  for (const char* model : kModels) {
    for (const char* strategy : {"standard", "checkpoint", "accumulation"}) {
      RunConfig c;
      c.model = model;
      c.preset = "tiny";
      c.strategy = parse_strategy(strategy);
      c.accum_steps = std::string(strategy) == "accumulation" ? 4 : 1;
      c.steps = 2;
      c.warmup_steps = 1;
      c.eval_batches = 1;
      c.sample_period_s = 0;
      Trainer trainer(c);
      const auto record = record_to_json(trainer.run());
      ASSERT_EQ(record["status"], "ok") << model << " " << strategy;
      ASSERT_TRUE(record["estimate"].is_object()) << model;
      const double measured = record["memory"]["peak_bytes"].get<double>();
      const double estimated = record["estimate"]["peak_bytes"].get<double>();
      EXPECT_NEAR(estimated / measured, 1.0, 0.25)
          << model << " " << strategy << ": estimated " << estimated << ", measured " << measured;
      // Parameters are exact, and so is the optimizer state of Adam (two moments).
      EXPECT_EQ(record["estimate"]["params_bytes"], record["memory"]["params_bytes"]) << model;
      EXPECT_EQ(record["estimate"]["optimizer_state_bytes"],
                record["memory"]["optimizer_state_bytes"])
          << model;
    }
  }
}

TEST(Estimate, RefusesWhatItHasNoModelOf) {
  RunConfig c;
  c.model = "quadratic";
  const Error toy = testing::expect_usage_error([&] { estimate_run(c, 0); });
  EXPECT_NE(std::string(toy.what()).find("no memory model"), std::string::npos) << toy.what();
  c.model = "llama";
  c.optimizer = "adafactor";
  const Error adafactor = testing::expect_usage_error([&] { estimate_run(c, 0); });
  EXPECT_NE(std::string(adafactor.what()).find("adafactor"), std::string::npos) << adafactor.what();
}

// 8-bit Adam's state as the optimizer keeps it (its own block size and threshold): the
// estimate equals what the run measured.
TEST(EstimateOptimizer, Adam8bitStateEqualsTheMeasured) {
  RunConfig c = testing::tiny_llama_config();
  c.optimizer = "adam8bit";
  c.batch = 2;
  c.steps = 1;
  c.warmup_steps = 0;
  c.sample_period_s = 0;
  const RunRecord r = Trainer(c).run();
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r.estimate.is_object());
  EXPECT_EQ(r.estimate["optimizer_state_bytes"].get<int64_t>(), r.memory->optimizer_state_bytes);
}

// The optimizers with low-rank or per-block state: the estimate from the parameters' shapes
// against what the run measured. Exact for muon (momentum for the blocks' matrices, AdamW's
// moments elsewhere) and apollo (its moments in rank r, one float per matrix for the norm
// limiter); galore also keeps its projector; adam-mini counts a row per block where it cuts
// q and k by head (an upper bound, a few hundred bytes above).
TEST(EstimateOptimizer, LowRankAndBlockStatesAgainstTheMeasured) {
  for (const char* name : {"muon", "apollo", "apollo-mini", "galore", "adam-mini"}) {
    SCOPED_TRACE(name);
    RunConfig c = testing::tiny_llama_config();
    c.optimizer = name;
    c.batch = 2;
    c.steps = 1;
    c.warmup_steps = 0;
    c.sample_period_s = 0;
    const RunRecord r = Trainer(c).run();
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(r.estimate.is_object());
    const auto estimated = r.estimate["optimizer_state_bytes"].get<int64_t>();
    const int64_t measured = r.memory->optimizer_state_bytes;
    if (std::string(name) == "adam-mini") {
      EXPECT_GE(estimated, measured);
      EXPECT_LE(estimated, measured + measured / 50);
    } else {
      EXPECT_EQ(estimated, measured);
    }
  }
}

// --recompute attention on the tiny Llama runs each block's attention sub-layer again, and
// nothing else. By hand: C = 64, 4 heads of 16 (q 64), 2 key-value heads (kv 32), T = 64,
// 2 blocks, batch 8: per block and sample 2 T (C q + 2 C kv + q C) for q, k, v and o, plus
// 2 x 2 T^2 q for the scores and the weighted sum.
TEST(EstimateFlops, RecomputeAttentionIsTheAttentionSubLayersByHand) {
  RunConfig c;
  c.model = "llama";
  c.preset = "tiny";
  c.batch = 8;
  c.recompute = Recompute::kAttention;
  const MemoryEstimate e = estimate_run(c, 0);
  const double T = 64, C = 64, q = 64, kv = 32;
  const double attention = 2 * T * (C * q + 2 * C * kv + q * C) + 2 * 2 * T * T * q;
  EXPECT_DOUBLE_EQ(e.hardware_flops_per_step - e.model_flops_per_step, 8 * 2 * attention);
  // The MLP policy recomputes the gate, up and down projections instead: 2 T x 3 C I.
  c.recompute = Recompute::kMlp;
  const MemoryEstimate m = estimate_run(c, 0);
  EXPECT_DOUBLE_EQ(m.hardware_flops_per_step - m.model_flops_per_step,
                   8 * 2 * (2 * T * 3 * C * 192));
}

TEST(EstimateFlops, CheckpointEveryWrapsEveryKthBlock) {
  RunConfig c;
  c.model = "llama";
  c.preset = "tiny";
  c.batch = 8;
  c.recompute = Recompute::kMlp;
  c.checkpoint_every = 2;  // block 0 of the 2
  const double T = 64, C = 64, I = 192;
  const MemoryEstimate e = estimate_run(c, 0);
  EXPECT_DOUBLE_EQ(e.recompute_flops_per_step, 8 * (2 * T * 3 * C * I));
  EXPECT_DOUBLE_EQ(e.recompute_flops_by_tower.at("decoder"), e.recompute_flops_per_step);
}

// NanoVLM's blocks are the vision tower's, then the decoder's, each with its own sizes. By
// hand at the tiny preset: vision C 64, I 256, 16 patches (no class token); decoder C 64,
// q 64, kv 32, I 192 over 4 image tokens + 32 caption positions = 36.
TEST(EstimateFlops, NanoVlmRecomputeIsCountedPerTower) {
  RunConfig c;
  c.model = "nanovlm";
  c.preset = "tiny";
  c.batch = 2;
  c.recompute = Recompute::kFull;
  const nlohmann::json arch = resolve_arch(c);
  const double Tv = 16, Cv = 64, Iv = 256;
  const double vision_block = (2 * Tv * 4 * Cv * Cv + 2 * 2 * Tv * Tv * Cv) + 2 * Tv * 2 * Cv * Iv;
  const double S = 36, C = 64, q = 64, kv = 32, I = 192;
  const double decoder_block =
      (2 * S * (C * q + 2 * C * kv + q * C) + 2 * 2 * S * S * q) + 2 * S * 3 * C * I;
  RecomputeFlops r = recompute_flops(c, arch, 32);
  EXPECT_DOUBLE_EQ(r.by_tower["vision"], 2 * 2 * vision_block);
  EXPECT_DOUBLE_EQ(r.by_tower["decoder"], 2 * 2 * decoder_block);
  EXPECT_DOUBLE_EQ(r.per_step, 2 * 2 * (vision_block + decoder_block));
  // Every other block of model.blocks(): the first vision block and the first decoder block.
  c.checkpoint_every = 2;
  r = recompute_flops(c, arch, 32);
  EXPECT_DOUBLE_EQ(r.by_tower["vision"], 2 * vision_block);
  EXPECT_DOUBLE_EQ(r.by_tower["decoder"], 2 * decoder_block);
  // The estimate says the same.
  const MemoryEstimate e = estimate_run(c, 0);
  EXPECT_DOUBLE_EQ(e.recompute_flops_by_tower.at("vision"), 2 * vision_block);
  EXPECT_DOUBLE_EQ(e.hardware_flops_per_step, e.model_flops_per_step + r.per_step);
}

// The blocks' sub-layers are the model's own count: with the LM head they make the whole
// forward of the Llama.
TEST(EstimateFlops, LlamaBlocksAndHeadMakeTheForward) {
  RunConfig c;
  c.model = "llama";
  c.preset = "small";
  const nlohmann::json arch = resolve_arch(c);
  const int64_t T = arch.at("seq_len").get<int64_t>();
  double blocks = 0;
  for (const BlockFlops& b : block_forward_flops("llama", arch, T)) blocks += b.attention + b.mlp;
  const double head =
      2.0 * arch.at("vocab_size").get<double>() * arch.at("hidden_size").get<double>();
  const double forward = model_registry().get("llama").forward_flops_per_token(arch, T) * T;
  EXPECT_NEAR(blocks + head * T, forward, 1e-9 * forward);
  EXPECT_TRUE(block_forward_flops("quadratic", arch, T).empty());
}

TEST(Estimate, MaxBatchIsTheLargestThatFits) {
  RunConfig c;
  c.model = "vit";
  c.preset = "tiny";
  const int64_t budget = 4 << 20;
  const int64_t b = max_batch_within(c, 0, budget);
  ASSERT_GT(b, 0);
  c.batch = b;
  EXPECT_LE(estimate_run(c, 0).peak_bytes, budget);
  c.batch = b + 1;
  EXPECT_GT(estimate_run(c, 0).peak_bytes, budget);
}

}  // namespace
}  // namespace gradscope
