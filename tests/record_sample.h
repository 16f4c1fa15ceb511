// A run record with every field set: every optional part present, every list non-empty, each
// value distinct from its default. Tests of the record's mappings (its JSON, the database's
// columns, the training state, docs/record.md) use it, so that a field one mapping forgets
// shows up as a missing key or a changed value.
#pragma once

#include <string>

#include "gradscope/core/record.h"
#include "test_util.h"

namespace gradscope::testing {

inline RankFigures sample_rank(int64_t rank) {
  RankFigures f;
  f.rank = rank;
  f.peak_bytes = 9000 + rank;
  f.breakdown = {1000, 200, 300, 400, 500, 600, 50, 70};
  f.peak_phase = "backward";
  f.params_bytes = 1200;
  f.grads_bytes = 300;
  f.optimizer_state_bytes = 400;
  f.collective_buffer_peak_bytes = 70;
  f.step_median_s = 0.125;
  f.comm_s = 0.25;
  f.backward_s = 0.5;
  f.bytes_sent_per_step = 4096.5;
  f.comm_wait_per_step_s = 0.03125;
  f.overlapped_share = 0.75;
  return f;
}

inline RunRecord full_record() {
  RunRecord r;
  r.run_id = "0123456789abcdef";
  r.attempt_uid = "00112233445566778899aabbccddeeff";
  r.sweep = "sample-sweep";
  r.config = tiny_llama_config();
  r.config.dataset = "sotu";
  // The settings a record holds only when they are in use.
  r.config.init_from = "weights";
  r.config.lora_targets = {"q", "v"};
  r.config.arch_overrides = {{"hidden_size", "64"}};
  r.config.lr_auto = true;
  r.arch = {{"hidden_size", 64}, {"seq_len", 32}};
  r.status = RunStatus::kDiverged;
  r.failure = RunFailure{7, "backward", "the loss became NaN"};
  // What an oom keeps of memory (a diverged run has none; the sample sets every field).
  FailureMemory memory;
  memory.cap_bytes = 4096;
  memory.live_bytes = 4000;
  memory.request = MemoryLabelBytes{"activations", "block 1 mlp", "forward", 512};
  memory.live = {{"activations", "block 0 attention", "forward", 2500},
                 {"parameters", "layers.0.mlp.up_proj.weight", "before the window", 1000}};
  memory.live_rest_bytes = 500;
  memory.live_by_component = {{"activations", "", "", 3000}, {"parameters", "", "", 1000}};
  memory.reserved_peak_bytes = 8192;
  MemoryMethodFit chunked{"chunked loss", "keeps the math and the compute", {"--loss", "chunked"},
                          4500, false, std::nullopt};
  MemoryMethodFit recompute{"recompute full in every block", "recomputes",
                            {"--recompute", "full"}, 3000, true, 1.5e6};
  memory.fit = MemoryFit{4096, 4600, 6, recompute, {chunked, recompute}};
  r.failure->memory = memory;
  r.params = 123456;
  r.trainable_params = 12345;
  r.data = {{"dataset", "sotu"}, {"train_tokens", 1000}};
  StepEntry warm{1, 3.5, 0.001, 2.25, 0.5, 16, 512, 496, 1, true, std::nullopt, {}};
  StepEntry timed{2, 3.25, 0.002, 1.75, 0.25, 16, 512, 496, 2, false, 1.5, {}};
  timed.contention.involuntary_switches = 12;
  timed.contention.steal_s = 0.0625;
  timed.contention.competing_tasks = 1.5;
  r.steps = {warm, timed};
  r.evals = {EvalEntry{2, 3.125, 0.375}};
  r.final_loss = 3.25;
  r.final_val_loss = 3.125;
  r.final_accuracy = 0.375;
  r.lr_search = std::vector<LrTrial>{LrTrial{0.01, 5, 4.5, 4.75, "ok", 1.25}};
  r.resumed_from_steps = {1};
  r.toy = ToyResult{{0.5, -0.5}, 0.25, {1.0, 1.0}, 0.125};
  r.estimate = {{"peak_bytes", 8000}};
  r.update_rule = "adama";
  r.time = RunTime{2.5, 3.5, 0.25, 0.125, 0.5, 1.0, 0.625, 0.0625, 2};
  r.throughput = RunThroughput{64.5, 2048.5};
  RunMemory m;
  m.peak_bytes = 9000;
  m.breakdown = {1000, 200, 300, 400, 500, 600, 50, 70};
  m.peak_phase = "forward";
  m.peak_step = 2;
  m.timeline = {StepMemory{2, {PhaseMemory{"forward", 100, 900, 800}}}};
  m.params_bytes = 1200;
  m.frozen_params_bytes = 200;
  m.grads_bytes = 300;
  m.optimizer_state_bytes = 400;
  m.activations_peak_bytes = 500;
  m.logits_bytes = 50;
  m.phase_peak_bytes = PhasePeaks{10, 20, 30, 40, 50};
  m.reserved_peak_bytes = 10000;
  m.peak_rss_bytes = 20000;
  m.window = MemoryWindow{2, 3, 8500};
  m.figures = {{"peak_bytes", "live tensors", 9000, 0},
               {"peak_rss_bytes", "the process's resident memory", 20000, 11000}};
  r.memory = m;
  r.distributed = RunDistributed{2, "zero2", "gradscope", "gloo", 4000, 2000,
                                 {sample_rank(0), sample_rank(1)}};
  r.distributed->nnodes = 2;
  r.distributed->hosts = {"node-a", "node-b"};
  r.distributed->interface = "eth0";
  r.distributed->link = RunLink{1048576, 3, 0.0625, 16777216.0};
  r.utilization = RunUtilization{"cpu", 80.5, 81.5, 95.5, 2, "process cpu time"};
  RunContention c;
  c.steps = 1;
  c.threads = 2;
  c.cpus = 4;
  c.timed_s = 0.25;
  c.involuntary_switches = 12;
  c.involuntary_switches_per_s = 48.5;
  c.steal_s = 0.0625;
  c.steal_pct = 6.25;
  c.competing_tasks_mean = 1.5;
  c.competing_tasks_max = 2.5;
  c.excess_tasks_mean = 0.5;
  c.disturbed = true;
  c.reasons = {"steal 6.25% of the CPUs' time"};
  r.contention = c;
  r.timeline = {TimelineSample{0.5, 4096, 75.5, 80.5, 8192, 70.5, 16384, 150.5, 1500.5, 12.5}};
  r.energy = RunEnergy{12.5, "rapl", 0.0025, "over the timed steps"};
  r.sampler = SamplerInfo{0.05, 1, 0.001, "not available", "rapl"};
  r.flops = RunFlops{1e9, 1.5e9, 4e9, 0.25, 0.375, 1.6e10, "datasheet", "3 x forward"};
  r.env = RunEnv{"0.2.0", "2.5.1", "12.4", "cpu", 2, 2, "abcdef0", "host", "Release"};
  r.started_at = "2026-01-01T00:00:00Z";
  r.finished_at = "2026-01-01T00:01:00Z";
  r.log = "sample.log";
  return r;
}

}  // namespace gradscope::testing
