// Records of schema gradscope.run/1 load: tests/fixtures/records holds a run record and a
// sweep's failure record as gradscope 0.1.0 (commit 048378a) wrote them.
#include "gradscope/core/record.h"

#include <gtest/gtest.h>

#include <string>

#include "gradscope/core/config.h"
#include "test_util.h"

namespace gradscope {
namespace {

using nlohmann::json;

json load_fixture(const std::string& name) {
  const std::string text = testing::slurp(testing::fixture("records/" + name));
  EXPECT_FALSE(text.empty()) << name;
  return json::parse(text);
}

// The record of `gradscope run --model llama --preset tiny --batch 16 --steps 300
// --warmup-steps 5 --eval-every 100` on the CPU.
TEST(RecordV1, RunRecordLoads) {
  const RunRecord r = record_from_json(load_fixture("v1-run.json"));
  EXPECT_EQ(r.schema, kRunSchemaV1);
  EXPECT_EQ(r.run_id, "907c8e000330f5aa");
  EXPECT_EQ(r.attempt_uid, "71cb14f0f990d2ca5f4225c53cff894d");
  EXPECT_FALSE(r.sweep.has_value());
  EXPECT_EQ(r.status, RunStatus::kOk);
  EXPECT_TRUE(r.ok());
  EXPECT_FALSE(r.failure.has_value());
  // Written before --diverge-above existed: only a NaN or infinite loss ended it.
  EXPECT_EQ(r.config.diverge_above, 0);
  EXPECT_EQ(RunConfig().diverge_above, 10);

  // The configuration, with the settings version 1 did not record at their defaults.
  const RunConfig& c = r.config;
  EXPECT_EQ(c.model, "llama");
  EXPECT_EQ(c.preset, "tiny");
  EXPECT_EQ(c.dataset, "sotu");
  EXPECT_EQ(c.tokenizer, "bytes");
  EXPECT_FALSE(c.dropout.has_value());
  EXPECT_TRUE(c.arch_overrides.empty());
  EXPECT_EQ(c.optimizer, "adam");
  EXPECT_DOUBLE_EQ(c.lr, 0.003);
  EXPECT_FALSE(c.lr_auto);
  EXPECT_TRUE(c.opt.empty());
  EXPECT_EQ(c.lr_schedule, LrSchedule::kConstant);
  EXPECT_EQ(c.batch, 16);
  EXPECT_EQ(c.accum_steps, 1);
  EXPECT_EQ(c.seq_len, 64);
  EXPECT_EQ(c.steps, 300);
  EXPECT_EQ(c.warmup_steps, 5);
  EXPECT_EQ(c.eval_every, 100);
  EXPECT_EQ(c.eval_batches, 8);
  EXPECT_EQ(c.seed, 0u);
  EXPECT_EQ(c.device, "cpu");
  EXPECT_EQ(c.dtype, Dtype::kFp32);
  EXPECT_EQ(c.memory_cap_bytes, 0);
  EXPECT_TRUE(c.phase_timing);
  EXPECT_TRUE(c.log_grad_norm);
  EXPECT_DOUBLE_EQ(c.sample_period_s, 0.1);
  const StepPlan plan = c.step_plan();
  EXPECT_EQ(plan.strategy_name(), "standard");
  EXPECT_EQ(plan.recompute, Recompute::kNone);
  EXPECT_EQ(plan.accum_steps, 1);
  EXPECT_EQ(plan.optimizer_step, OptimizerStep::kAfterBackward);
  ASSERT_TRUE(r.arch.is_object());
  EXPECT_EQ(r.arch["hidden_size"], 64);
  EXPECT_EQ(r.arch["vocab_size"], 320);
  EXPECT_EQ(r.arch["tokenizer"], "bytes");

  EXPECT_EQ(r.params, 119104);
  EXPECT_EQ(r.data["train_tokens"], 10546413);

  ASSERT_EQ(r.steps.size(), 305u);
  const StepEntry& first = r.steps.front();
  EXPECT_EQ(first.step, 1);
  EXPECT_TRUE(first.warmup);
  EXPECT_DOUBLE_EQ(first.loss.value_or(-1), 5.766279220581055);
  EXPECT_DOUBLE_EQ(first.grad_norm.value_or(-1), 2.1974411010742188);
  EXPECT_DOUBLE_EQ(first.lr, 0.003);
  EXPECT_EQ(first.samples, 16);
  EXPECT_EQ(first.tokens, 1024);
  EXPECT_EQ(first.targets, 1024);
  EXPECT_EQ(first.evaluations, 1);
  EXPECT_EQ(r.steps.back().step, 305);
  EXPECT_FALSE(r.steps.back().warmup);
  EXPECT_DOUBLE_EQ(r.steps.back().loss.value_or(-1), 2.1748030185699463);

  ASSERT_EQ(r.evals.size(), 4u);
  EXPECT_EQ(r.evals[0].step, 100);
  EXPECT_DOUBLE_EQ(r.evals[0].val_loss.value_or(-1), 2.993210405111313);
  EXPECT_FALSE(r.evals[0].accuracy.has_value());
  EXPECT_EQ(r.evals[3].step, 305);
  EXPECT_DOUBLE_EQ(r.final_loss.value_or(-1), 2.1748030185699463);
  EXPECT_DOUBLE_EQ(r.final_val_loss.value_or(-1), 2.2637694478034973);
  EXPECT_FALSE(r.final_accuracy.has_value());
  EXPECT_FALSE(r.lr_search.has_value());
  EXPECT_FALSE(r.toy.has_value());
  EXPECT_EQ(r.estimate["peak_bytes"], 19832580);

  ASSERT_TRUE(r.time.has_value());
  EXPECT_DOUBLE_EQ(r.time->total_s.value_or(-1), 5.972396286000048);
  EXPECT_DOUBLE_EQ(r.time->wall_s.value_or(-1), 6.840370937999978);
  EXPECT_DOUBLE_EQ(r.time->forward_s.value_or(-1), 2.015161954999371);
  EXPECT_EQ(r.time->timed_steps, 300);
  ASSERT_TRUE(r.throughput.has_value());
  EXPECT_DOUBLE_EQ(r.throughput->tokens_per_s.value_or(-1), 51436.64038505122);

  ASSERT_TRUE(r.memory.has_value());
  const RunMemory& m = *r.memory;
  EXPECT_EQ(m.peak_bytes, 21143308);
  EXPECT_EQ(m.breakdown.params, 476416);
  EXPECT_EQ(m.breakdown.grads, 476416);
  EXPECT_EQ(m.breakdown.optimizer_state, 952832);
  EXPECT_EQ(m.breakdown.activations, 18396176);
  EXPECT_EQ(m.breakdown.other, 841468);
  EXPECT_EQ(m.params_bytes, 476416);
  EXPECT_EQ(m.grads_bytes, 476416);
  EXPECT_EQ(m.optimizer_state_bytes, 952832);
  EXPECT_EQ(m.activations_peak_bytes, 18396176);
  ASSERT_TRUE(m.phase_peak_bytes.has_value());
  EXPECT_EQ(m.phase_peak_bytes->data, 1453824);
  EXPECT_EQ(m.phase_peak_bytes->forward, 19841808);
  EXPECT_EQ(m.phase_peak_bytes->backward, 21143308);
  EXPECT_EQ(m.phase_peak_bytes->optimizer, 2077712);
  EXPECT_FALSE(m.reserved_peak_bytes.has_value());
  EXPECT_EQ(m.peak_rss_bytes, 412479488);
  ASSERT_EQ(m.timeline.size(), 300u);
  EXPECT_EQ(m.timeline[0].step, 6);
  ASSERT_EQ(m.timeline[0].phases.size(), 4u);
  const PhaseMemory& forward = m.timeline[0].phases[1];
  EXPECT_EQ(forward.phase, "forward");
  EXPECT_EQ(forward.entry_bytes, 1453824);
  EXPECT_EQ(forward.peak_bytes, 19841808);
  EXPECT_EQ(forward.exit_bytes, 18521868);

  ASSERT_TRUE(r.utilization.has_value());
  EXPECT_EQ(r.utilization->device, "cpu");
  EXPECT_EQ(r.utilization->samples, 300);
  ASSERT_EQ(r.timeline.size(), 63u);
  EXPECT_FALSE(r.timeline[0].cpu_util_pct.has_value());
  EXPECT_FALSE(r.timeline[0].gpu_util_pct.has_value());
  EXPECT_EQ(r.timeline[0].rss_bytes, 254951424);
  EXPECT_DOUBLE_EQ(r.timeline[0].energy_j.value_or(-1), 0.0);
  EXPECT_DOUBLE_EQ(r.timeline[1].util_pct.value_or(-1), 98.85730641800814);
  EXPECT_EQ(r.timeline[1].allocated_bytes, 18603788);
  ASSERT_TRUE(r.energy.has_value());
  EXPECT_DOUBLE_EQ(r.energy->joules.value_or(-1), 122.4);
  EXPECT_EQ(r.energy->source, "estimate");
  EXPECT_FALSE(r.energy->co2_g.has_value());
  ASSERT_TRUE(r.sampler.has_value());
  EXPECT_EQ(r.sampler->samples, 63);
  EXPECT_DOUBLE_EQ(r.sampler->period_s, 0.1);
  ASSERT_TRUE(r.flops.has_value());
  EXPECT_DOUBLE_EQ(r.flops->per_step, 830472192.0);
  EXPECT_DOUBLE_EQ(r.flops->achieved_per_s.value_or(-1), 41715526845.39962);
  EXPECT_FALSE(r.flops->mfu.has_value());
  EXPECT_EQ(r.flops->peak_source, "unknown");
  ASSERT_TRUE(r.env.has_value());
  EXPECT_EQ(r.env->gradscope, "0.1.0");
  EXPECT_EQ(r.env->libtorch, "1.13.0");
  EXPECT_FALSE(r.env->cuda.has_value());
  EXPECT_EQ(r.env->git_commit, "048378a899a4");
  EXPECT_EQ(r.env->threads, 1);
  EXPECT_EQ(r.started_at, "2026-12-01T18:59:59Z");
  EXPECT_EQ(r.finished_at, "2026-12-01T19:00:06Z");
  EXPECT_FALSE(r.log.has_value());
}

// What the sweep wrote for a run that ended without its own record (here stopped at the
// sweep's run_timeout): the configuration as given, the status and the failure; nothing
// measured.
TEST(RecordV1, SweepFailureRecordLoads) {
  const RunRecord r = record_from_json(load_fixture("v1-failure.json"));
  EXPECT_EQ(r.schema, kRunSchemaV1);
  EXPECT_EQ(r.run_id, "aab421eff8ec131a");
  EXPECT_EQ(r.attempt_uid, "95c1c49b77824e2ee0d7f38ac55647f4");
  EXPECT_EQ(r.sweep, "nightly");
  EXPECT_EQ(r.status, RunStatus::kTimeout);
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(is_final_status(r.status));
  ASSERT_TRUE(r.failure.has_value());
  EXPECT_FALSE(r.failure->step.has_value());
  EXPECT_FALSE(r.failure->phase.has_value());
  EXPECT_EQ(r.failure->message, "stopped after 2 s (run_timeout)");

  EXPECT_EQ(r.config.model, "llama");
  EXPECT_EQ(r.config.preset, "tiny");
  EXPECT_EQ(r.config.optimizer, "adam");
  EXPECT_DOUBLE_EQ(r.config.lr, 0.0);  // as given: not resolved
  EXPECT_EQ(r.config.dataset, "");
  EXPECT_EQ(r.config.batch, 2);
  EXPECT_EQ(r.config.seq_len, 32);
  EXPECT_EQ(r.config.steps, 1000000);
  EXPECT_EQ(r.config.eval_batches, 1);
  EXPECT_EQ(r.config.step_plan().strategy_name(), "standard");
  EXPECT_TRUE(r.arch.is_null());

  EXPECT_FALSE(r.params.has_value());
  EXPECT_TRUE(r.steps.empty());
  EXPECT_TRUE(r.evals.empty());
  EXPECT_FALSE(r.final_loss.has_value());
  EXPECT_FALSE(r.final_val_loss.has_value());
  // Version 1 kept the attempt's elapsed time in total_s; read, it is wall time, as in v2.
  ASSERT_TRUE(r.time.has_value());
  EXPECT_DOUBLE_EQ(r.time->wall_s.value_or(-1), 2.081261519);
  EXPECT_FALSE(r.time->total_s.has_value());
  EXPECT_FALSE(r.time->forward_s.has_value());
  EXPECT_FALSE(r.time->timed_steps.has_value());
  EXPECT_FALSE(r.throughput.has_value());
  EXPECT_FALSE(r.memory.has_value());
  EXPECT_FALSE(r.utilization.has_value());
  EXPECT_TRUE(r.timeline.empty());
  EXPECT_FALSE(r.energy.has_value());
  EXPECT_FALSE(r.sampler.has_value());
  EXPECT_FALSE(r.flops.has_value());
  EXPECT_FALSE(r.env.has_value());
  EXPECT_EQ(r.log, "results/nightly.db.logs/aab421eff8ec131a-1.log");
  EXPECT_EQ(r.started_at, "2026-12-01T19:16:21Z");
  EXPECT_EQ(r.finished_at, "2026-12-01T19:16:23Z");
}

// A loaded version-1 record is written back as version 2, and that reads back the same.
TEST(RecordV1, WritesBackAsVersionTwo) {
  for (const char* name : {"v1-run.json", "v1-failure.json"}) {
    SCOPED_TRACE(name);
    const json v1 = load_fixture(name);
    const json v2 = record_to_json(record_from_json(v1));
    EXPECT_EQ(v2["schema"], kRunSchema);
    EXPECT_EQ(v2["schema"], "gradscope.run/2");
    EXPECT_EQ(v2["run_id"], v1["run_id"]);
    EXPECT_EQ(v2["status"], v1["status"]);
    EXPECT_EQ(v2["steps"], v1["steps"]);
    EXPECT_EQ(v2["eval"], v1["eval"]);
    EXPECT_EQ(v2["failure"], v1["failure"]);
    EXPECT_EQ(record_to_json(record_from_json(v2)), v2);
  }
}

TEST(RecordV1, ASweepNameWithControlCharactersOrTooLongIsRefused) {
  // Control characters, too long, a C1 control, Latin-1 (not UTF-8), a cut-short sequence.
  for (const std::string sweep : {std::string("\x1b]0;title\x07"), std::string(257, 's'),
                                  std::string("a\xc2\x9b"
                                              "31m"),
                                  std::string("caf\xe9"), std::string("ab\xe2\x82")}) {
    json j = load_fixture("v1-run.json");
    j["sweep"] = sweep;
    const Error e = testing::expect_usage_error([&] { record_from_json(j); });
    EXPECT_TRUE(testing::contains(e.what(), "has the sweep name")) << e.what();
  }
  // Any other text stays a name, spaces and UTF-8 included.
  for (const std::string sweep : {std::string(256, 's'), std::string("my study \xc3\xa9t\xc3\xa9")}) {
    json j = load_fixture("v1-run.json");
    j["sweep"] = sweep;
    EXPECT_EQ(record_from_json(j).sweep, sweep);
  }
}

TEST(RecordV1, UnknownSchemaIsRefused) {
  json j = load_fixture("v1-failure.json");
  j["schema"] = "gradscope.run/9";
  const Error e = testing::expect_usage_error([&] { record_from_json(j); });
  EXPECT_TRUE(testing::contains(e.what(), "gradscope.run/9")) << e.what();
}

}  // namespace
}  // namespace gradscope
