// The report: statistics against reference values, findings and recommendations on hand-made
// databases whose right answers are known, and the files of a report built from a real sweep
// (valid SVG and PNG, CSV columns, no missing file, the same bytes twice, and a headless
// Chromium rendering every figure).
#include <sqlite3.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <regex>
#include <set>

#include <fmt/format.h>

#include "gradscope/report/analysis.h"
#include "gradscope/report/contrasts.h"
#include "gradscope/report/csv.h"
#include "gradscope/report/encode.h"
#include "gradscope/report/render.h"
#include "gradscope/report/tables.h"
#include "gradscope/store/db.h"
#include "test_util.h"

namespace gradscope {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// ---- statistics ----

TEST(ReportStats, StudentTQuantilesMatchTables) {
  // Two-sided 95% critical values from any t table.
  EXPECT_NEAR(student_t_quantile(0.975, 1), 12.7062, 1e-3);
  EXPECT_NEAR(student_t_quantile(0.975, 2), 4.3027, 1e-4);
  EXPECT_NEAR(student_t_quantile(0.975, 4), 2.7764, 1e-4);
  EXPECT_NEAR(student_t_quantile(0.975, 10), 2.2281, 1e-4);
  EXPECT_NEAR(student_t_quantile(0.975, 30), 2.0423, 1e-4);
  EXPECT_NEAR(student_t_quantile(0.995, 5), 4.0321, 1e-4);
  EXPECT_NEAR(student_t_quantile(0.025, 10), -2.2281, 1e-4);
  EXPECT_NEAR(student_t_quantile(0.5, 3), 0.0, 1e-9);
}

TEST(ReportStats, MeanIntervalIsTTimesStandardError) {
  const Interval i = mean_interval({1, 2, 3});
  EXPECT_DOUBLE_EQ(i.mean, 2);
  EXPECT_EQ(i.n, 3);
  EXPECT_NEAR(i.half_width, 4.302653 / std::sqrt(3.0), 1e-5);
  const Interval one = mean_interval({5});
  EXPECT_FALSE(one.has_interval());
  EXPECT_DOUBLE_EQ(one.lo(), 5);
  EXPECT_EQ(mean_interval({}).n, 0);
}

TEST(ReportStats, LossAtAveragesTheLastTenthUpToThePoint) {
  std::vector<CurvePoint> curve;
  for (int i = 1; i <= 20; ++i) {
    CurvePoint p;
    p.step = i;
    p.samples = 4.0 * i;
    p.loss = i;
    curve.push_back(p);
  }
  EXPECT_DOUBLE_EQ(*loss_at(curve, Axis::kSteps, 20), 19.5);  // steps 19 and 20
  EXPECT_DOUBLE_EQ(*loss_at(curve, Axis::kSteps, 9.5), 9);    // one step: 9
  EXPECT_DOUBLE_EQ(*loss_at(curve, Axis::kSamples, 40), 10);  // 40 samples = step 10
  EXPECT_FALSE(loss_at(curve, Axis::kSteps, 0.5).has_value());
}

// ---- hand-made databases ----

struct FakeRun {
  std::string model = "llama", optimizer = "adam", strategy = "standard", device = "cpu";
  int64_t seed = 0, batch = 8, accum = 1, steps = 20, eval_batches = 8;
  double peak = 100 * 1024.0 * 1024, step_s = 0.1, util = 99, memory_cap = 0, lr = 0.001;
  // Its rate was searched (--lr auto): runs that can carry a verdict (claims.h).
  bool lr_auto = true;
  std::string lr_chosen_by;  // --lr-chosen-by (with lr_auto false)
  std::string status = "ok";
  // Loss of step i (1-based) given the samples seen after it.
  std::function<double(int, double)> loss = [](int, double) { return 1.0; };
  int64_t evaluations = 1;    // forward + backward passes per step (a line search: more)
  double flops_per_step = 0;  // hardware FLOPs of one pass; 0: no flops in the record
  // Validation loss after step i, every eval_every steps (0: never evaluated).
  int64_t eval_every = 0;
  std::function<double(int)> val = [](int) { return 1.0; };
  // Its timings were disturbed: the record's contention part says so, as a busy machine's.
  bool disturbed = false;
};

// n seeds of a run: seed s has its loss, step time and utilization scaled by
// 1 + spread x (s - (n - 1) / 2), so the seeds spread around the given run.
std::vector<FakeRun> seeds_of(const FakeRun& r, int n = 3, double spread = 0.01) {
  std::vector<FakeRun> out;
  for (int s = 0; s < n; ++s) {
    FakeRun x = r;
    x.seed = s;
    const double f = 1 + spread * (s - (n - 1) / 2.0);
    const auto base = r.loss;
    x.loss = [base, f](int i, double samples) { return base(i, samples) * f; };
    const auto val = r.val;
    x.val = [val, f](int i) { return val(i) * f; };
    x.step_s *= f;
    x.util *= f;
    out.push_back(x);
  }
  return out;
}

std::vector<FakeRun> all_of(std::initializer_list<std::vector<FakeRun>> parts) {
  std::vector<FakeRun> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// The record of a run as JSON (schema 1, as older databases hold them).
json record_json(const FakeRun& r) {
  const auto bytes = [](double b) { return static_cast<int64_t>(b); };
  json config = {{"model", r.model},
                 {"preset", "tiny"},
                 {"optimizer", r.optimizer},
                 {"strategy", r.strategy},
                 {"seed", r.seed},
                 {"batch", r.batch},
                 {"accum_steps", r.accum},
                 {"steps", r.steps},
                 {"lr", r.lr},
                 {"lr_auto", r.lr_auto},
                 {"lr_chosen_by", r.lr_chosen_by},
                 {"threads", 1},
                 {"seq_len", 16},
                 {"device", r.device},
                 {"dtype", "fp32"},
                 {"eval_batches", r.eval_batches},
                 {"memory_cap_bytes", bytes(r.memory_cap)},
                 {"arch", {{"hidden_size", 64}, {"num_hidden_layers", 2}}}};
  json steps = json::array();
  double samples = 0;
  for (int i = 1; i <= r.steps; ++i) {
    samples += r.batch * r.accum;
    steps.push_back({{"step", i},
                     {"loss", r.loss(i, samples)},
                     {"lr", r.lr},
                     {"grad_norm", 1.0},
                     {"time_s", r.step_s},
                     {"samples", r.batch * r.accum},
                     {"tokens", 16 * r.batch * r.accum},
                     {"targets", 16 * r.batch * r.accum},
                     {"evaluations", r.evaluations}});
  }
  json evals = json::array();
  double last_val = kNaN;
  for (int i = 1; r.eval_every > 0 && i <= r.steps; ++i)
    if (i % r.eval_every == 0 || i == r.steps) {
      last_val = r.val(i);
      evals.push_back({{"step", i}, {"val_loss", last_val}});
    }
  // A plain id (records refuse others), distinct for distinct runs whatever their names.
  const std::string id =
      file_slug(fmt::format("{}-{}-{}-{}-{}-{}-{}-{}-{}-{}", r.model, r.optimizer, r.strategy,
                            r.seed, r.batch, r.accum, r.memory_cap, r.eval_batches, r.steps, r.lr));
  return {
      {"schema", "gradscope.run/1"},
      {"run_id", id},
      {"attempt_uid", id},
      {"status", r.status},
      {"started_at", "2026-01-01T00:00:00Z"},
      {"finished_at", "2026-01-01T00:00:01Z"},
      {"config", config},
      {"steps", steps},
      {"eval", evals},
      {"final_loss", r.loss(r.steps, samples)},
      {"final_val_loss", std::isfinite(last_val) ? json(last_val) : json(nullptr)},
      {"flops", r.flops_per_step > 0
                    ? json{{"per_step", r.flops_per_step}, {"hardware_per_step", r.flops_per_step}}
                    : json(nullptr)},
      {"params", 1000},
      {"env", {{"device_name", "test device"}, {"libtorch", "1.13.0"}}},
      {"time",
       {{"step_median_s", r.step_s},
        {"timed_steps", r.steps},
        {"total_s", r.step_s * r.steps},
        {"data_s", 0.1 * r.step_s * r.steps},
        {"forward_s", 0.3 * r.step_s * r.steps},
        {"backward_s", 0.5 * r.step_s * r.steps},
        {"optimizer_s", 0.1 * r.step_s * r.steps}}},
      {"memory",
       {{"peak_bytes", bytes(r.peak)},
        {"breakdown",
         {{"params", bytes(0.1 * r.peak)},
          {"grads", bytes(0.1 * r.peak)},
          {"optimizer_state", bytes(0.2 * r.peak)},
          {"activations", bytes(0.5 * r.peak)},
          {"other", bytes(0.1 * r.peak)}}}}},
      // Records name the kind of device: "cpu" or "gpu".
      {"utilization",
       {{"device", r.device.rfind("cuda", 0) == 0 ? "gpu" : "cpu"},
        {"mean_pct", r.util},
        {"source", "test"}}},
      {"energy", {{"joules", 50.0 * r.step_s * r.steps}, {"source", "nvml"}}},
      {"timeline",
       json::array({{{"t_s", 0.0}, {"util_pct", r.util}}, {{"t_s", 1.0}, {"util_pct", r.util}}})}};
}

RunRecord record_of(const FakeRun& r) {
  json j = record_json(r);
  // What competed for the run's cores: a busy machine's when disturbed, a quiet one's else.
  j["contention"] = {{"steps", r.steps},
                     {"threads", 1},
                     {"cpus", 2},
                     {"involuntary_switches_per_s", r.disturbed ? 400.0 : 2.0},
                     {"competing_tasks_mean", r.disturbed ? 2.0 : 0.0},
                     {"excess_tasks_mean", r.disturbed ? 1.0 : 0.0},
                     {"disturbed", r.disturbed},
                     {"reasons", r.disturbed ? json::array({"2.00 runnable tasks besides the "
                                                            "run's 1 threads"})
                                             : json::array()}};
  return record_from_json(j);
}

// Stores the runs in a fresh database and analyzes it, as `gradscope report` does.
ReportData analyze_runs(const std::vector<FakeRun>& runs, const ReportOptions& options = {}) {
  testing::TempDir dir("gradscope-report");
  Database db(dir.file("runs.db"));
  for (const FakeRun& r : runs) db.write_run(record_of(r));
  return analyze(db, options);
}

// The runs at the length a verdict needs (kMinVerdictSteps; shorter ones give an indicative
// verdict only).
ReportData analyze_long_runs(std::vector<FakeRun> runs, const ReportOptions& options = {}) {
  for (FakeRun& r : runs) r.steps = std::max<int64_t>(r.steps, kMinVerdictSteps);
  return analyze_runs(runs, options);
}

const Finding& finding(const ReportData& d, const std::string& id) {
  for (const Finding& f : d.findings)
    if (f.id == id) return f;
  throw std::runtime_error("no finding " + id);
}

TEST(ReportFindings, AccumulationTenfoldOnTheVlmIsReproducedAtEqualStepsOnly) {
  // The accumulated run's loss falls with the samples it has seen, like the standard run's,
  // but it sees 4x the samples per step: 10x lower at equal steps, equal at equal samples.
  const double a = std::log(10.0) / (100 * 8 * 3);
  auto by_samples = [a](int, double s) { return 2.0 * std::exp(-a * s); };
  FakeRun standard{"nanovlm"};
  standard.loss = by_samples;
  FakeRun accum = standard;
  accum.strategy = "accumulation";
  accum.accum = 4;
  // The LM: accumulation only 1.5x better, at the same memory.
  FakeRun lm{"llama"};
  lm.loss = [](int, double) { return 1.5; };
  FakeRun lm_accum = lm;
  lm_accum.strategy = "accumulation";
  lm_accum.accum = 4;
  lm_accum.loss = [](int, double) { return 1.0; };
  const ReportData d =
      analyze_long_runs(all_of({seeds_of(standard), seeds_of(accum), seeds_of(lm),
                                seeds_of(lm_accum)}));
  const Finding& vlm = finding(d, "accumulation-vlm");
  EXPECT_EQ(vlm.verdict, Verdict::kReproduced) << vlm.measured;
  EXPECT_EQ(vlm.verdict_equal_samples, Verdict::kNotReproduced) << vlm.measured;
  EXPECT_EQ(vlm.verdict_equal_evaluations, Verdict::kNotReproduced) << vlm.measured;
  ASSERT_EQ(vlm.evidence.size(), 1u);
  EXPECT_TRUE(testing::contains(vlm.evidence[0].what, "same micro-batch 8"));
  const Finding& llm = finding(d, "accumulation-lm");
  EXPECT_EQ(llm.verdict, Verdict::kNotReproduced) << llm.measured;
  EXPECT_TRUE(testing::contains(llm.measured, "1.50x")) << llm.measured;
}

TEST(ReportFindings, AccumulationThatNeedsMoreMemoryIsNotReproduced) {
  FakeRun standard{"nanovlm"};
  standard.loss = [](int, double) { return 2.0; };
  FakeRun accum = standard;
  accum.strategy = "accumulation";
  accum.accum = 4;
  accum.peak *= 1.5;
  accum.loss = [](int, double) { return 0.1; };
  const Finding f =
      finding(analyze_long_runs(all_of({seeds_of(standard), seeds_of(accum)})), "accumulation-vlm");
  EXPECT_EQ(f.verdict, Verdict::kNotReproduced) << f.measured;
}

TEST(ReportFindings, WithoutComparableRunsThereIsNotEnoughData) {
  FakeRun vit{"vit"};
  vit.device = "cuda:0";
  vit.util = 50;
  const ReportData d = analyze_long_runs(seeds_of(vit));
  for (const char* id : {"accumulation-vlm", "accumulation-lm", "adam-not-best", "checkpoint-loss",
                         "checkpoint-time", "utilization-lm"})
    EXPECT_EQ(finding(d, id).verdict, Verdict::kNotEnoughData) << id;
  EXPECT_EQ(finding(d, "utilization-vision").verdict, Verdict::kNotReproduced);
}

TEST(ReportFindings, AdamBeatenSomewhereIsReproducedAndAdamBestEverywhereIsNot) {
  FakeRun adam{"llama"};
  adam.loss = [](int, double) { return 1.0; };
  FakeRun sgd = adam;
  sgd.optimizer = "sgd";
  sgd.loss = [](int, double) { return 0.5; };
  EXPECT_EQ(
      finding(analyze_long_runs(all_of({seeds_of(adam), seeds_of(sgd)})), "adam-not-best").verdict,
      Verdict::kReproduced);
  sgd.loss = [](int, double) { return 1.5; };
  EXPECT_EQ(
      finding(analyze_long_runs(all_of({seeds_of(adam), seeds_of(sgd)})), "adam-not-best").verdict,
      Verdict::kNotReproduced);
}

TEST(ReportFindings, ADifferenceWithinTheSeedIntervalIsTooCloseToCall) {
  // Three seeds each; SGD is ahead by 0.01 on average while seeds spread by 0.2.
  std::vector<FakeRun> runs;
  for (int seed = 0; seed < 3; ++seed) {
    FakeRun adam{"llama"};
    adam.seed = seed;
    const double spread = 0.2 * (seed - 1);
    adam.loss = [spread](int, double) { return 1.0 + spread; };
    FakeRun sgd = adam;
    sgd.optimizer = "sgd";
    // The seeds do not move the two optimizers alike: pairing by seed does not help.
    sgd.loss = [spread](int, double) { return 0.99 - spread; };
    runs.push_back(adam);
    runs.push_back(sgd);
  }
  const ReportData d = analyze_long_runs(runs);
  ASSERT_EQ(d.groups.size(), 2u);  // seeds pooled
  EXPECT_EQ(d.groups[0].runs.size(), 3u);
  EXPECT_TRUE(d.groups[0].final_loss.has_interval());
  const Finding& f = finding(d, "adam-not-best");
  EXPECT_EQ(f.verdict, Verdict::kNotEnoughData) << f.measured;
  ASSERT_EQ(f.evidence.size(), 1u);
  EXPECT_TRUE(testing::contains(f.evidence[0].steps, "undecided")) << f.evidence[0].steps;
  // The undecided contrast says what it could have detected and what it would need.
  ASSERT_EQ(f.contrasts.size(), 1u);
  EXPECT_TRUE(testing::contains(f.contrasts[0], "could detect")) << f.contrasts[0];
  EXPECT_TRUE(testing::contains(f.contrasts[0], "seeds a side")) << f.contrasts[0];
}

// A standard run and its checkpointed twin: the same losses, 30% more time, 60% of the peak.
std::pair<FakeRun, FakeRun> standard_and_checkpoint() {
  FakeRun standard{"llama"};
  standard.loss = [](int i, double) { return 3.0 / i; };
  FakeRun checkpoint = standard;
  checkpoint.strategy = "checkpoint";
  checkpoint.step_s = 0.13;
  checkpoint.peak *= 0.6;
  return {standard, checkpoint};
}

// The noise floor beside a standard run: accumulation at its effective batch (4 micro-batches
// of a quarter), whose seeds end `drift` x (1 + 0.05 s) away from the standard seed s.
std::vector<FakeRun> noise_floor_runs(const FakeRun& standard, double drift, double spread) {
  FakeRun accum = standard;
  accum.strategy = "accumulation";
  accum.batch = standard.batch / 4;
  accum.accum = 4;
  accum.eval_batches = standard.eval_batches;
  std::vector<FakeRun> runs = seeds_of(accum, 3, spread);
  for (FakeRun& r : runs) {
    const double f = 1 + drift * (1 + 0.05 * r.seed);
    const auto base = r.loss;
    r.loss = [base, f](int i, double samples) { return base(i, samples) * f; };
  }
  return runs;
}

TEST(ReportFindings, CheckpointingWithTheSameLossAndThirtyPercentMoreTime) {
  auto [standard, checkpoint] = standard_and_checkpoint();
  // Seeds that agree to 1e-5; runs of the same gradient drift 0.2% apart.
  const std::vector<FakeRun> floor = noise_floor_runs(standard, 0.002, 1e-5);
  const ReportData d = analyze_long_runs(
      all_of({seeds_of(standard, 3, 1e-5), seeds_of(checkpoint, 3, 1e-5), floor}));
  EXPECT_EQ(finding(d, "checkpoint-loss").verdict, Verdict::kNotReproduced);
  EXPECT_EQ(finding(d, "checkpoint-time").verdict, Verdict::kReproduced)
      << finding(d, "checkpoint-time").measured;
  // Twice the time is more than "up to 60%"; a different loss is a change.
  checkpoint.step_s = 0.2;
  checkpoint.loss = [](int i, double) { return 3.1 / i; };
  const ReportData e = analyze_long_runs(
      all_of({seeds_of(standard, 3, 1e-5), seeds_of(checkpoint, 3, 1e-5), floor}));
  EXPECT_EQ(finding(e, "checkpoint-time").verdict, Verdict::kNotReproduced);
  EXPECT_EQ(finding(e, "checkpoint-loss").verdict, Verdict::kReproduced);
}

TEST(ReportDisturbance, DisturbedRunsAreMarkedAndLeftOutOfEverythingOfTime) {
  auto [standard, checkpoint] = standard_and_checkpoint();
  std::vector<FakeRun> runs = all_of({seeds_of(standard, 3, 1e-5), seeds_of(checkpoint, 4, 1e-5)});
  // The last of four checkpoint seeds ran beside a busy loop: its steps took 0.6 s.
  runs.back().step_s = 0.6;
  runs.back().disturbed = true;
  const ReportData d = analyze_runs(runs);
  const auto group = std::find_if(d.groups.begin(), d.groups.end(),
                                  [](const Group& g) { return g.strategy == "checkpoint"; });
  ASSERT_NE(group, d.groups.end());
  EXPECT_EQ(group->ok_runs.size(), 4u);         // still a run of the group: its loss counts
  EXPECT_EQ(group->disturbed_runs.size(), 1u);  // but not its time
  EXPECT_EQ(group->step_s.n, 3);
  EXPECT_NEAR(group->step_s.mean, 0.13, 1e-3);
  EXPECT_EQ(group->final_loss.n, 4);
  EXPECT_EQ(group->tokens_per_s.n, 0);  // the fake records have no throughput at all
  EXPECT_EQ(group_loss_at(d, *group, Axis::kTime, 1e9).n, 3);
  EXPECT_EQ(group_loss_at(d, *group, Axis::kSteps, 20).n, 4);
  // With its 0.6 s the checkpoint would cost 2.5 times the standard step (more than "up to
  // 60%"), not 1.3 times.
  const Finding& time = finding(d, "checkpoint-time");
  EXPECT_TRUE(testing::contains(time.measured, "step time 1.30x")) << time.measured;
  // 20 steps: the rule's leaning, not a verdict.
  EXPECT_EQ(time.leaning, Verdict::kReproduced) << time.measured;
  // The report says which runs and why.
  const std::string md = markdown_summary(d);
  EXPECT_TRUE(testing::contains(md, "1 run(s) had disturbed timings")) << md;
  EXPECT_TRUE(testing::contains(md, "2.00 runnable tasks besides the run's 1 threads")) << md;
  EXPECT_TRUE(testing::contains(md, "(1 of 4 runs disturbed, left out)")) << md;
  EXPECT_TRUE(testing::contains(runs_csv(d), ",timing_disturbed,")) << runs_csv(d);
  // Nor does its time reach a recommendation's time to the point (20 steps x 0.13 s).
  int checkpoint_recommended = 0;  // the leanest budget fits the checkpointed runs alone
  for (const Recommendation& r : d.recommendations)
    if (r.best && d.groups[*r.best].strategy == "checkpoint") {
      ++checkpoint_recommended;
      EXPECT_NEAR(r.time_to_point_s, 20 * 0.13, 0.05);
    }
  EXPECT_GT(checkpoint_recommended, 0);
}

TEST(ReportDisturbance, ADisturbedRunsUtilizationIsNoEvidence) {
  FakeRun lm{"llama"};
  lm.device = "cuda:0";
  lm.util = 12;
  std::vector<FakeRun> runs = seeds_of(lm, 4, 0.0);
  // One seed ran beside another job: its GPU waited, at a fifth of the others' utilization.
  runs.back().util = 2.4;
  runs.back().disturbed = true;
  const ReportData d = analyze_runs(runs);
  const Finding& f = finding(d, "utilization-lm");
  ASSERT_EQ(f.evidence.size(), 1u) << f.measured;
  EXPECT_TRUE(testing::contains(f.evidence[0].steps, "3 seed(s)")) << f.evidence[0].steps;
  EXPECT_TRUE(testing::contains(f.measured, "median 12.0%")) << f.measured;
}

TEST(ReportUnreadable, ADatabaseWithNoReadableRecordSaysWhy) {
  testing::TempDir dir("gradscope-report");
  const std::string path = dir.file("runs.db");
  {
    Database db(path);
    db.write_run(record_of(FakeRun{"llama"}));
  }
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw,
                         "UPDATE runs SET record_json = json_set(record_json, '$.run_id', "
                         "'<b>x</b>')",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(raw);
  Database db(path, DatabaseAccess::kReadOnly);
  const Error e = testing::expect_usage_error([&] { analyze(db, ReportOptions{}); });
  EXPECT_TRUE(testing::contains(e.what(), "holds 1 attempt(s), none of them a readable run record"))
      << e.what();
  EXPECT_TRUE(testing::contains(e.what(), "run_id")) << e.what();
}

TEST(ReportDisturbance, QuietRunsAreNotMarked) {
  FakeRun standard{"llama"};
  const ReportData d = analyze_runs(seeds_of(standard, 3));
  ASSERT_TRUE(d.runs.front().record.contention.has_value());  // measured, and quiet
  EXPECT_FALSE(d.runs.front().record.contention->disturbed);
  EXPECT_TRUE(d.groups.front().disturbed_runs.empty());
  EXPECT_EQ(d.groups.front().step_s.n, 3);
  EXPECT_FALSE(testing::contains(markdown_summary(d), "disturbed")) << markdown_summary(d);
}

TEST(ReportFindings, UtilizationRangesAndTheDeviceCaveat) {
  FakeRun lm{"llama"};
  lm.device = "cuda:0";  // the record's utilization.device is "gpu"
  lm.util = 12;
  FakeRun vit{"vit"};
  vit.device = "cpu";
  vit.util = 98;
  const ReportData d = analyze_long_runs(all_of({seeds_of(lm), seeds_of(vit)}));
  EXPECT_EQ(finding(d, "utilization-lm").verdict, Verdict::kReproduced)
      << finding(d, "utilization-lm").measured;
  EXPECT_TRUE(finding(d, "utilization-lm").notes.empty());
  // A CPU's 98% is CPU time over wall time, not the study's GPU utilization.
  const Finding& v = finding(d, "utilization-vision");
  EXPECT_EQ(v.verdict, Verdict::kNotComparable) << v.measured;
  EXPECT_EQ(v.verdict_equal_evaluations, Verdict::kNotComparable);
  ASSERT_EQ(v.notes.size(), 1u);
  EXPECT_TRUE(testing::contains(v.notes[0], "GPU utilization"));
  // The verdict is shown as such everywhere.
  EXPECT_STREQ(verdict_name(Verdict::kNotComparable), "not comparable here");
  EXPECT_TRUE(testing::contains(markdown_summary(d), "| not comparable here |"));
  EXPECT_TRUE(testing::contains(claims_csv(d.findings), "utilization-vision,"));
  EXPECT_TRUE(testing::contains(claims_csv(d.findings), ",not comparable here,"));
  // With a GPU run beside the CPU ones, only the GPU run counts.
  FakeRun gpu_vit = vit;
  gpu_vit.device = "cuda:0";
  gpu_vit.batch = 4;
  gpu_vit.util = 50;
  const Finding w =
      finding(analyze_long_runs(all_of({seeds_of(vit), seeds_of(gpu_vit)})), "utilization-vision");
  EXPECT_EQ(w.verdict, Verdict::kNotReproduced) << w.measured;
}

// ---- the rule every verdict follows: named contrasts, 3 seeds a side, Holm at 95% ----

TEST(ReportVerdicts, OneSeedEachIsNotEnoughDataHoweverTheyDiffer) {
  // One seed each, SGD 1e-7 below Adam: before the rule, that counted as Adam beaten.
  FakeRun adam{"llama"};
  FakeRun sgd = adam;
  sgd.optimizer = "sgd";
  sgd.loss = [](int, double) { return 1.0 - 1e-7; };
  const ReportData d = analyze_long_runs({adam, sgd});
  const Finding& f = finding(d, "adam-not-best");
  EXPECT_EQ(f.verdict, Verdict::kNotEnoughData) << f.measured;
  EXPECT_EQ(f.verdict_equal_samples, Verdict::kNotEnoughData);
  EXPECT_EQ(f.verdict_equal_evaluations, Verdict::kNotEnoughData);
  ASSERT_FALSE(f.notes.empty());
  EXPECT_TRUE(testing::contains(f.notes.back(), "fewer than 3 seeds")) << f.notes.back();
  // Two seeds are not enough either, even a tenfold difference.
  sgd.loss = [](int, double) { return 0.1; };
  const Finding two =
      finding(analyze_long_runs(all_of({seeds_of(adam, 2), seeds_of(sgd, 2)})), "adam-not-best");
  EXPECT_EQ(two.verdict, Verdict::kNotEnoughData) << two.measured;
  // Every rule says so.
  for (const ClaimRule& rule : study_claims())
    EXPECT_TRUE(testing::contains(rule.rule, "Holm's step-down")) << rule.id;
}

// Adam at two learning rates in one cell: the worse one is not a rival optimizer, and SGD is
// held against the better one. Two fixed rates, neither chosen by a recorded search: the
// verdict is indicative, and the rule's leaning is what is tested.
TEST(ReportVerdicts, AdamIsNeverItsOwnRivalAndOthersMeetItsBestGroup) {
  FakeRun adam{"llama"};
  adam.lr_auto = false;
  FakeRun adam_hot = adam;
  adam_hot.lr = 0.01;
  adam_hot.loss = [](int, double) { return 1.5; };
  const Finding alone =
      finding(analyze_long_runs(all_of({seeds_of(adam), seeds_of(adam_hot)})), "adam-not-best");
  EXPECT_NE(alone.verdict, Verdict::kReproduced) << alone.measured;
  EXPECT_TRUE(alone.evidence.empty());
  // SGD beats the worse Adam clearly, but not the better one.
  FakeRun sgd = adam;
  sgd.optimizer = "sgd";
  sgd.loss = [](int, double) { return 1.2; };
  const Finding f = finding(
      analyze_long_runs(all_of({seeds_of(adam), seeds_of(adam_hot), seeds_of(sgd)})),
      "adam-not-best");
  EXPECT_EQ(f.leaning, Verdict::kNotReproduced) << f.measured << f.evidence[0].steps;
  EXPECT_EQ(f.verdict, Verdict::kIndicativeOnly);
  ASSERT_EQ(f.evidence.size(), 1u);
}

// SGD's runs at seeds of their own (no pairing): seeds 10, 11, 12.
std::vector<FakeRun> other_seeds(const FakeRun& r) {
  std::vector<FakeRun> runs = seeds_of(r);
  for (FakeRun& x : runs) x.seed += 10;
  return runs;
}

// Many cells in which every optimizer ties Adam within the seeds' spread: some would pass at
// 5% each by chance; the claim as a whole is held at 5% (Holm: the smallest p at 5% / 4).
TEST(ReportVerdicts, ManyComparisonsAreHeldAtFivePercentTogether) {
  FakeRun adam{"llama"};
  FakeRun sgd = adam;
  sgd.optimizer = "sgd";
  // Seeds spread by 1%: SGD 3% ahead is p about 0.03 alone, significant at 5% but not at 5%/4.
  sgd.loss = [](int, double) { return 0.97; };
  std::vector<FakeRun> runs;
  for (int64_t batch : {8, 9, 10, 11}) {
    FakeRun a = adam, o = sgd;
    a.batch = o.batch = batch;
    // Cells with values of their own (the same values would be one comparison).
    const double f = 1 + 1e-3 * batch;
    a.loss = [f](int, double) { return f; };
    o.loss = [f](int, double) { return 0.97 * f; };
    for (const auto& part : {seeds_of(a), other_seeds(o)})
      runs.insert(runs.end(), part.begin(), part.end());
  }
  const Finding f = finding(analyze_long_runs(runs), "adam-not-best");
  EXPECT_EQ(f.verdict, Verdict::kNotEnoughData) << f.measured;
  ASSERT_EQ(f.evidence.size(), 4u);
  // The smallest p is held to 5% / 4; the next would be held to 5% / 3 only if it was below.
  const auto held = [&f](const char* level) {
    return std::count_if(f.evidence.begin(), f.evidence.end(), [level](const Evidence& e) {
      return testing::contains(e.steps, std::string("held to ") + level);
    });
  };
  // None is below 0.0125, so the step-down stops there: every one was held to it.
  EXPECT_EQ(held("0.0125"), 4);
  EXPECT_TRUE(testing::contains(f.correction, "Holm over 4 contrast(s)")) << f.correction;
}

// Checkpointing against standard, seed by seed, held against the noise floor: how far runs of
// the same gradient (accumulation at the standard effective batch) drift apart. The old rule
// held the difference against a fixed 0.1% band: a 0.5% difference was a change, although runs
// that must train alike drift 1.1% apart.
TEST(ReportVerdicts, CheckpointLossIsHeldAgainstTheNoiseFloorNotAFixedBand) {
  FakeRun standard{"vit"};
  // Checkpointed seeds `drift` x (1 + 0.05 s) away from the standard seed s.
  const auto checkpoints = [&standard](double drift) {
    std::vector<FakeRun> runs = noise_floor_runs(standard, drift, 0.01);
    for (FakeRun& r : runs) {
      r.strategy = "checkpoint";
      r.batch = standard.batch;
      r.accum = 1;
      r.step_s *= 1.3;
    }
    return runs;
  };
  const std::vector<FakeRun> floor = noise_floor_runs(standard, 0.011, 0.01);
  const Finding f = finding(
      analyze_long_runs(all_of({seeds_of(standard), checkpoints(0.005), floor})),
      "checkpoint-loss");
  EXPECT_EQ(f.verdict, Verdict::kNotReproduced) << f.measured;
  ASSERT_EQ(f.evidence.size(), 1u);
  EXPECT_TRUE(testing::contains(f.evidence[0].steps, "noise floor median 1.1"))
      << f.evidence[0].steps;
  // A 3% difference is above the same floor.
  const Finding g = finding(
      analyze_long_runs(all_of({seeds_of(standard), checkpoints(0.03), floor})), "checkpoint-loss");
  EXPECT_EQ(g.verdict, Verdict::kReproduced) << g.measured;
  // The same losses bit for bit in every seed changed nothing: no floor, no test needed.
  std::vector<FakeRun> twins = seeds_of(standard);
  for (FakeRun& r : twins) {
    r.strategy = "checkpoint";
    r.step_s *= 1.3;
  }
  const Finding same = finding(analyze_long_runs(all_of({seeds_of(standard), twins})),
                               "checkpoint-loss");
  EXPECT_EQ(same.verdict, Verdict::kNotReproduced) << same.measured;
  EXPECT_TRUE(testing::contains(same.headline, "the same losses bit for bit")) << same.headline;
  EXPECT_TRUE(testing::contains(same.correction, "Holm over 0 contrast(s)")) << same.correction;
  EXPECT_TRUE(testing::contains(same.correction, "1 with the same losses bit for bit"))
      << same.correction;
  // Without a floor there is no verdict, however small the difference.
  const Finding h =
      finding(analyze_long_runs(all_of({seeds_of(standard), checkpoints(0.005)})),
              "checkpoint-loss");
  EXPECT_EQ(h.verdict, Verdict::kNotEnoughData) << h.measured;
  ASSERT_FALSE(h.notes.empty());
  EXPECT_TRUE(testing::contains(h.notes[0], "no noise floor")) << h.notes[0];
}

TEST(ReportVerdicts, ThreeSeedsEachAndWelchBelowFivePercentDecide) {
  FakeRun adam{"llama"};
  FakeRun sgd = adam;
  sgd.optimizer = "sgd";
  sgd.loss = [](int, double) { return 0.97; };
  // Seeds spread by 1%, SGD's of its own: its 3% lead is significant (Welch p about 0.03).
  const ReportData d = analyze_long_runs(all_of({seeds_of(adam), other_seeds(sgd)}));
  const Finding& f = finding(d, "adam-not-best");
  EXPECT_EQ(f.verdict, Verdict::kReproduced) << f.measured;
  ASSERT_EQ(f.evidence.size(), 1u);
  EXPECT_TRUE(testing::contains(f.evidence[0].steps, "Welch t")) << f.evidence[0].steps;
  EXPECT_TRUE(testing::contains(f.evidence[0].steps, "passes")) << f.evidence[0].steps;
  const WelchTest w = welch_t_test({0.97 * 0.99, 0.97, 0.97 * 1.01}, {0.99, 1.0, 1.01});
  EXPECT_LT(w.p, 0.05);
  // A 0.5% lead over the same spread is not.
  sgd.loss = [](int, double) { return 0.995; };
  EXPECT_EQ(finding(analyze_long_runs(all_of({seeds_of(adam), other_seeds(sgd)})), "adam-not-best")
                .verdict,
            Verdict::kNotEnoughData);
  // At the same seeds, which move both optimizers alike, the 0.5% lead is paired by seed and
  // significant: the seeds' spread is not the comparison's.
  const Finding paired =
      finding(analyze_long_runs(all_of({seeds_of(adam), seeds_of(sgd)})), "adam-not-best");
  EXPECT_EQ(paired.verdict, Verdict::kReproduced) << paired.measured;
  EXPECT_TRUE(testing::contains(paired.evidence[0].steps, "paired t")) << paired.evidence[0].steps;
}

// The Adam claim as the study states it: Adadelta and SGD against Adam on the encoder and the
// decoder. The old rule counted every cell, so SGD ahead on the ViT alone reproduced it.
TEST(ReportVerdicts, TheAdamClaimIsDecidedByTheContrastsItNames) {
  std::vector<FakeRun> runs;
  for (const char* model : {"vit", "llama", "modernbert"}) {
    FakeRun adam{model};
    FakeRun sgd = adam;
    sgd.optimizer = "sgd";
    sgd.loss = [model](int, double) { return std::string(model) == "vit" ? 0.5 : 1.5; };
    runs = all_of({runs, seeds_of(adam), seeds_of(sgd)});
  }
  const Finding f = finding(analyze_long_runs(runs), "adam-not-best");
  EXPECT_EQ(f.verdict, Verdict::kNotReproduced) << f.measured;
  ASSERT_EQ(f.contrasts.size(), 2u);  // llama and modernbert; the ViT's is shown only
  for (const std::string& c : f.contrasts) EXPECT_FALSE(testing::contains(c, "vit")) << c;
  ASSERT_EQ(f.evidence.size(), 3u);
  for (const Evidence& e : f.evidence)
    EXPECT_EQ(testing::contains(e.what, "[shown, does not decide]"),
              testing::contains(e.what, "vit"))
        << e.what;
}

// A checkpointed cell computes what its standard cell computes: the same values are one
// comparison, not two. The old rule counted both and held each at 5% / 2.
TEST(ReportVerdicts, ContrastsWithTheSameValuesAreCountedOnce) {
  FakeRun adam{"llama"};
  FakeRun sgd = adam;
  sgd.optimizer = "sgd";
  sgd.loss = [](int, double) { return 0.975; };  // Welch p about 0.036 on its own seeds
  FakeRun adam_ckpt = adam, sgd_ckpt = sgd;
  adam_ckpt.strategy = sgd_ckpt.strategy = "checkpoint";
  ClaimRule every = *std::find_if(study_claims().begin(), study_claims().end(),
                                  [](const ClaimRule& r) { return r.id == "adam-not-best"; });
  every.measure.contrast_strategy.clear();
  const ReportData d = analyze_long_runs(
      all_of({seeds_of(adam), other_seeds(sgd), seeds_of(adam_ckpt), other_seeds(sgd_ckpt)}));
  const Finding f = evaluate_claim(d, every);
  EXPECT_EQ(f.verdict, Verdict::kReproduced) << f.correction;
  EXPECT_TRUE(testing::contains(f.correction, "Holm over 1 contrast(s)")) << f.correction;
  EXPECT_TRUE(testing::contains(f.correction, "1 with the same values as another counted once"))
      << f.correction;
  // Counted twice, each at 5% / 2, the same data would not have decided.
  const WelchTest w = welch_t_test({0.975 * 0.99, 0.975, 0.975 * 1.01}, {0.99, 1.0, 1.01});
  EXPECT_GT(w.p, 0.05 / 2);
  EXPECT_LT(w.p, 0.05);
}

// A ratio claim on the log scale: a seed whose losses are all five times the others' decides a
// linear test of standard - 5 x accumulation (its differences are the largest), not the ratio.
TEST(ReportVerdicts, RatioClaimsAreTestedOnTheLogScale) {
  // Per seed: (standard, accumulation) with standard - 5 x accumulation about 1 in every seed,
  // but ratios of 5.6, 10 and 15.
  const double pairs[3][2] = {{10.0, 1.8}, {2.01, 0.2}, {1.49, 0.1}};
  std::vector<FakeRun> runs;
  for (int s = 0; s < 3; ++s) {
    FakeRun standard{"nanovlm"};
    standard.seed = s;
    const double ls = pairs[s][0], la = pairs[s][1];
    standard.loss = [ls](int, double) { return ls; };
    FakeRun accum = standard;
    accum.strategy = "accumulation";
    accum.accum = 4;
    accum.eval_batches = 2;
    accum.loss = [la](int, double) { return la; };
    runs.push_back(standard);
    runs.push_back(accum);
  }
  const ReportData d = analyze_long_runs(runs);
  const Finding f = finding(d, "accumulation-vlm");
  EXPECT_EQ(f.verdict, Verdict::kNotEnoughData) << f.measured;
  ASSERT_EQ(f.contrasts.size(), 1u);
  EXPECT_TRUE(testing::contains(f.contrasts[0], "paired t")) << f.contrasts[0];
  // The old rule's linear scale.
  ClaimRule linear = *std::find_if(study_claims().begin(), study_claims().end(),
                                   [](const ClaimRule& r) { return r.id == "accumulation-vlm"; });
  linear.thresholds.log_scale = false;
  EXPECT_EQ(evaluate_claim(d, linear).verdict, Verdict::kReproduced);
}

// A seed that blew up counts against its configuration: the old rule dropped it, and SGD's two
// good seeds stood for the configuration.
TEST(ReportVerdicts, DivergedSeedsCountAsNoBetterThanTheyBegan) {
  FakeRun adam{"llama"};
  FakeRun sgd = adam;
  sgd.optimizer = "sgd";
  sgd.loss = [](int i, double) { return i == 1 ? 1.2 : 0.5; };
  std::vector<FakeRun> sgds = seeds_of(sgd, 4);
  sgds.back().status = "diverged";
  sgds.back().loss = [](int i, double) { return i == 1 ? 1.2 : 30.0; };
  const Finding f = finding(analyze_long_runs(all_of({seeds_of(adam, 4), sgds})), "adam-not-best");
  ASSERT_EQ(f.evidence.size(), 1u);
  EXPECT_TRUE(testing::contains(f.evidence[0].steps, "(1 and 0 diverged seed(s) counted"))
      << f.evidence[0].steps;
  EXPECT_NE(f.verdict, Verdict::kReproduced) << f.evidence[0].steps;
  // Without the diverged seed, SGD's three good seeds beat Adam.
  sgds.pop_back();
  EXPECT_EQ(finding(analyze_long_runs(all_of({seeds_of(adam, 4), sgds})), "adam-not-best").verdict,
            Verdict::kReproduced);
}

// Accumulation at a rate tuned for its own step is paired with the standard step at the rate
// tuned for that and shown beside accumulation at the standard rate, which decides (the study's
// reading, one vote per cell). A searched rate (--lr auto) is the run's own: such groups pair
// by their settings, whatever rates their searches found.
TEST(ReportVerdicts, AccumulationAtItsOwnTunedRateIsShownBesideTheStandardRate) {
  FakeRun standard{"nanovlm"};
  standard.lr_auto = false;
  standard.lr_chosen_by = "a rate sweep";
  standard.loss = [](int, double) { return 2.0; };
  FakeRun same_rate = standard;
  same_rate.strategy = "accumulation";
  same_rate.accum = 4;
  same_rate.eval_batches = 2;
  same_rate.loss = [](int, double) { return 1.0; };
  FakeRun own_rate = same_rate;
  own_rate.lr = 0.003;
  own_rate.loss = [](int, double) { return 0.3; };
  const Finding f = finding(
      analyze_long_runs(all_of({seeds_of(standard), seeds_of(same_rate), seeds_of(own_rate)})),
      "accumulation-vlm");
  ASSERT_EQ(f.evidence.size(), 2u) << f.measured;
  const auto own = std::find_if(f.evidence.begin(), f.evidence.end(), [](const Evidence& e) {
    return testing::contains(e.what, "each tuned for its own step");
  });
  ASSERT_NE(own, f.evidence.end());
  EXPECT_TRUE(testing::contains(own->what, "[shown, does not decide]")) << own->what;
  ASSERT_EQ(f.contrasts.size(), 1u);
  // The standard rate's pair: 2x, below half the claimed 10x.
  EXPECT_EQ(f.verdict, Verdict::kNotReproduced) << f.contrasts[0];
  // A rate not chosen by a recorded choice meets nothing at another rate.
  own_rate.lr_chosen_by.clear();
  const Finding g = finding(
      analyze_long_runs(all_of({seeds_of(standard), seeds_of(same_rate), seeds_of(own_rate)})),
      "accumulation-vlm");
  EXPECT_EQ(g.evidence.size(), 1u) << g.measured;
  // Searched rates: the runs found 0.001 and 0.003, and still pair as one configuration.
  FakeRun searched = standard;
  searched.lr_auto = true;
  searched.lr_chosen_by.clear();
  FakeRun searched_accum = own_rate;
  searched_accum.lr_auto = true;
  const Finding h = finding(
      analyze_long_runs(all_of({seeds_of(searched), seeds_of(searched_accum)})),
      "accumulation-vlm");
  ASSERT_EQ(h.evidence.size(), 1u) << h.measured;
  EXPECT_FALSE(testing::contains(h.evidence[0].what, "own step")) << h.evidence[0].what;
  EXPECT_EQ(h.verdict, Verdict::kReproduced) << h.contrasts.at(0);
}

// Runs at untuned rates, or too short (the demo's: 20 steps at the defaults), say which way the
// rule pointed, never "reproduced".
TEST(ReportVerdicts, UntunedOrShortRunsGiveAnIndicativeVerdictOnly) {
  FakeRun adam{"llama"};
  FakeRun sgd = adam;
  sgd.optimizer = "sgd";
  sgd.loss = [](int, double) { return 0.5; };
  const Finding shorter = finding(analyze_runs(all_of({seeds_of(adam), seeds_of(sgd)})),
                                  "adam-not-best");  // 20 steps
  EXPECT_EQ(shorter.verdict, Verdict::kIndicativeOnly);
  EXPECT_EQ(shorter.leaning, Verdict::kReproduced);
  EXPECT_TRUE(testing::contains(shorter.notes.back(), "20 steps, under 100"))
      << shorter.notes.back();
  adam.lr_auto = sgd.lr_auto = false;
  const Finding untuned = finding(analyze_long_runs(all_of({seeds_of(adam), seeds_of(sgd)})),
                                  "adam-not-best");
  EXPECT_EQ(untuned.verdict, Verdict::kIndicativeOnly);
  EXPECT_TRUE(testing::contains(untuned.scale, "0 of 2 configurations at tuned rates"))
      << untuned.scale;
  EXPECT_STREQ(verdict_name(untuned.verdict), "indicative only");
}

// Seeds needed, against the closed form: paired differences of mean 1 and sd 1 at 5%, 80%
// power: the smallest n with (t(0.975, n-1) + t(0.8, n-1)) / sqrt(n) <= 1 is 10.
TEST(ReportVerdicts, SeedsNeededSolveThePowerEquation) {
  const ContrastStat s = test_contrast({1.0, 2.0, 0.0}, std::vector<double>{0.0, 0.0, 0.0},
                                       {0, 1, 2}, {0, 1, 2}, 1.0, false);
  ASSERT_TRUE(s.paired);
  EXPECT_DOUBLE_EQ(s.effect, 1.0);
  EXPECT_DOUBLE_EQ(s.sd, 1.0);
  ASSERT_TRUE(seeds_needed(s, 0.05).has_value());
  EXPECT_EQ(*seeds_needed(s, 0.05), 10);
  const double t9 = student_t_quantile(0.975, 8) + student_t_quantile(0.8, 8);
  EXPECT_GT(t9 / 3.0, 1.0);  // 9 seeds are not enough
  // What three seeds could detect: (t(0.975, 2) + t(0.8, 2)) x 1 / sqrt(3).
  EXPECT_NEAR(detectable_effect(s, 0.05),
              (student_t_quantile(0.975, 2) + student_t_quantile(0.8, 2)) / std::sqrt(3.0), 1e-9);
  // No difference: no number of seeds.
  const ContrastStat zero = test_contrast({1.0, -1.0, 0.0}, std::vector<double>{0.0, 0.0, 0.0},
                                          {0, 1, 2}, {0, 1, 2}, 1.0, false);
  EXPECT_FALSE(seeds_needed(zero, 0.05).has_value());
}

// CG with a strong-Wolfe search spends 26 forward-backward passes per step. Per step it gets
// further than Adam; per gradient evaluation (equal compute) it is behind.
TEST(ReportVerdicts, ALineSearchIsJudgedAtEqualGradientEvaluations) {
  const double a = 1e-3;
  FakeRun adam{"llama"};
  adam.steps = 100;
  adam.flops_per_step = 1e9;
  adam.loss = [a](int, double samples) { return 2.0 * std::exp(-a * samples); };
  FakeRun cg = adam;
  cg.optimizer = "cg";
  cg.evaluations = 26;
  cg.loss = [a](int i, double) { return 2.0 * std::exp(-a * 3 * 8 * i); };  // 3x Adam per step
  const ReportData d = analyze_long_runs(all_of({seeds_of(adam), seeds_of(cg)}));
  // The compute axes.
  const Group& g_cg = d.groups[0].optimizer == "cg" ? d.groups[0] : d.groups[1];
  const Group& g_adam = d.groups[0].optimizer == "cg" ? d.groups[1] : d.groups[0];
  EXPECT_DOUBLE_EQ(g_cg.steps_total, 100);
  EXPECT_DOUBLE_EQ(g_cg.evaluations_total, 100 * 26 * 8);
  EXPECT_DOUBLE_EQ(g_adam.evaluations_total, 100 * 8);
  EXPECT_DOUBLE_EQ(g_cg.flops_total, 100 * 26 * 1e9);
  EXPECT_DOUBLE_EQ(g_adam.flops_total, 100 * 1e9);
  // CG is not one of the claim's named contrasts: shown, not tested.
  EXPECT_EQ(finding(d, "adam-not-best").verdict, Verdict::kNotEnoughData);
  // The same claim with every optimizer against Adam deciding.
  ClaimRule every = *std::find_if(study_claims().begin(), study_claims().end(),
                                  [](const ClaimRule& r) { return r.id == "adam-not-best"; });
  every.measure.contrast_optimizers.clear();
  const Finding f = evaluate_claim(d, every);
  EXPECT_EQ(f.verdict, Verdict::kReproduced) << f.measured;  // per step, CG wins
  EXPECT_EQ(f.verdict_equal_samples, Verdict::kReproduced) << f.measured;
  // At Adam's 800 evaluations CG has made 3 steps: behind.
  EXPECT_EQ(f.verdict_equal_evaluations, Verdict::kNotReproduced) << f.measured;
  ASSERT_EQ(f.evidence.size(), 1u);
  EXPECT_TRUE(testing::contains(f.evidence[0].evaluations, "at 800 evaluations"))
      << f.evidence[0].evaluations;
  EXPECT_TRUE(testing::contains(f.evidence[0].time, "at 10 time")) << f.evidence[0].time;
  // Recommendations rank at equal evaluations: Adam, not CG.
  ASSERT_FALSE(d.recommendations.empty());
  for (const Recommendation& r : d.recommendations) {
    ASSERT_TRUE(r.best.has_value());
    EXPECT_EQ(d.groups[*r.best].optimizer, "adam");
    EXPECT_DOUBLE_EQ(r.equal_evaluations, 800);
  }
}

TEST(ReportVerdicts, AccumulationIsPairedAtTheSameMicroBatchAndAtTheSameEffectiveBatch) {
  // Micro-batch 4 x 2 against standard at batch 4 (the study's setup) and at batch 8.
  const double a = std::log(10.0) / 80;
  auto by_samples = [a](int, double s) { return 2.0 * std::exp(-a * s); };
  FakeRun accum{"nanovlm"};
  accum.strategy = "accumulation";
  accum.batch = 4;
  accum.accum = 2;
  accum.loss = by_samples;
  FakeRun micro{"nanovlm"};
  micro.batch = 4;
  micro.loss = by_samples;
  FakeRun effective = micro;
  effective.batch = 8;
  // Evaluated on the standard runs' samples: half the effective batches of 8 (evaluation
  // settings do not keep a pair apart).
  accum.eval_batches = micro.eval_batches / 2;
  const ReportData d =
      analyze_long_runs(all_of({seeds_of(accum), seeds_of(micro), seeds_of(effective)}));
  const Finding& f = finding(d, "accumulation-vlm");
  ASSERT_EQ(f.evidence.size(), 2u);
  std::string both;
  for (const Evidence& e : f.evidence) both += e.what + "\n";
  EXPECT_TRUE(testing::contains(both, "same micro-batch 4: effective batch 8 vs 4")) << both;
  EXPECT_TRUE(testing::contains(both, "same effective batch 8: micro-batch 4 vs 8")) << both;
  EXPECT_TRUE(testing::contains(both, "[shown, does not decide]")) << both;
  // At the same micro-batch accumulation has seen twice the samples per step: 10x at equal
  // steps, the same at equal samples.
  EXPECT_EQ(f.verdict, Verdict::kReproduced) << f.measured;
  EXPECT_EQ(f.verdict_equal_samples, Verdict::kNotReproduced) << f.measured;
  EXPECT_TRUE(testing::contains(f.measured, "same micro-batch")) << f.measured;
  EXPECT_TRUE(testing::contains(f.measured, "same effective batch")) << f.measured;
  // The same accumulation also stored with another eval_batches (a grid edited between two
  // sweeps on one database): each standard group is still paired once per setting.
  FakeRun accum_again = accum;
  accum_again.eval_batches = micro.eval_batches;
  const ReportData twice = analyze_long_runs(
      all_of({seeds_of(accum), seeds_of(accum_again), seeds_of(micro), seeds_of(effective)}));
  EXPECT_EQ(finding(twice, "accumulation-vlm").evidence.size(), 2u);
  // The same with the standard side stored twice too (the whole grid's evaluation changed):
  // still one comparison per setting.
  FakeRun micro_again = micro;
  micro_again.eval_batches = accum_again.eval_batches / 2;
  FakeRun effective_again = effective;
  effective_again.eval_batches = accum_again.eval_batches / 2;
  const ReportData both_sides =
      analyze_long_runs(all_of({seeds_of(accum), seeds_of(accum_again), seeds_of(micro),
                           seeds_of(micro_again), seeds_of(effective), seeds_of(effective_again)}));
  EXPECT_EQ(finding(both_sides, "accumulation-vlm").evidence.size(), 2u);
}

TEST(ReportRecommendations, RankByValidationLossWhereEveryConfigurationHasOne) {
  // Adam trains lower, SGD validates lower: the recommendation follows validation.
  FakeRun adam{"vit"};
  adam.eval_every = 5;
  adam.loss = [](int, double) { return 0.5; };
  adam.val = [](int) { return 1.2; };
  FakeRun sgd = adam;
  sgd.optimizer = "sgd";
  sgd.peak *= 0.99;
  sgd.loss = [](int, double) { return 0.8; };
  sgd.val = [](int) { return 0.9; };
  const ReportData d = analyze_runs(all_of({seeds_of(adam), seeds_of(sgd)}));
  ASSERT_FALSE(d.recommendations.empty());
  const Recommendation& unlimited = d.recommendations.front();
  ASSERT_TRUE(unlimited.best.has_value());
  EXPECT_EQ(d.groups[*unlimited.best].optimizer, "sgd");
  EXPECT_EQ(unlimited.loss_kind, "validation");
  EXPECT_NEAR(unlimited.best_loss.mean, 0.9, 1e-12);
  EXPECT_TRUE(testing::contains(markdown_summary(d), "validation 0.9000"));
  // Without SGD's evaluations, Adam is still ranked by validation loss; SGD is not ranked,
  // and the row names it with both training losses.
  sgd.eval_every = 0;
  const ReportData e = analyze_runs(all_of({seeds_of(adam), seeds_of(sgd)}));
  const Recommendation& r = e.recommendations.front();
  ASSERT_TRUE(r.best.has_value());
  EXPECT_EQ(e.groups[*r.best].optimizer, "adam");
  EXPECT_EQ(r.loss_kind, "validation");
  EXPECT_NEAR(r.best_loss.mean, 1.2, 1e-12);
  EXPECT_TRUE(testing::contains(r.loss_note, "not ranked, no validation loss by then: sgd"))
      << r.loss_note;
  EXPECT_TRUE(testing::contains(r.loss_note, "(training 0.8000")) << r.loss_note;
  EXPECT_TRUE(testing::contains(r.loss_note, "the chosen one's training loss there 0.5000"))
      << r.loss_note;
  // With no evaluation anywhere, training loss ranks, and the row says so.
  adam.eval_every = 0;
  const ReportData t = analyze_runs(all_of({seeds_of(adam), seeds_of(sgd)}));
  const Recommendation& by_training = t.recommendations.front();
  ASSERT_TRUE(by_training.best.has_value());
  EXPECT_EQ(t.groups[*by_training.best].optimizer, "adam");
  EXPECT_EQ(by_training.loss_kind, "training");
  EXPECT_TRUE(testing::contains(by_training.loss_note, "no ranked configuration has"))
      << by_training.loss_note;
}

// A configuration that lost a seed, or whose run blew up without a NaN, is no contender: its
// surviving seeds would look better than the configuration is.
TEST(ReportRecommendations, AConfigurationWithAFailedOrBlownUpRunIsNotRanked) {
  FakeRun adam{"vit"};
  adam.eval_every = 5;
  adam.val = [](int) { return 1.0; };
  FakeRun sgd = adam;  // the lowest validation loss, but one of its seeds diverged
  sgd.optimizer = "sgd";
  sgd.val = [](int) { return 0.5; };
  std::vector<FakeRun> sgd_seeds = seeds_of(sgd);
  sgd_seeds[0].status = "diverged";
  FakeRun adagrad = adam;  // lower still, but a seed ends far above where it started
  adagrad.optimizer = "adagrad";
  adagrad.val = [](int) { return 0.4; };
  std::vector<FakeRun> adagrad_seeds = seeds_of(adagrad);
  adagrad_seeds[2].loss = [](int i, double) { return 1.0 + 50.0 * i; };
  const ReportData d = analyze_runs(all_of({seeds_of(adam, 3, 0.1), sgd_seeds, adagrad_seeds}));
  const Recommendation& r = d.recommendations.front();
  ASSERT_TRUE(r.best.has_value());
  EXPECT_EQ(d.groups[*r.best].optimizer, "adam");
  EXPECT_TRUE(r.not_worse.empty());
  EXPECT_TRUE(testing::contains(r.loss_note, "not ranked: ")) << r.loss_note;
  EXPECT_TRUE(testing::contains(r.loss_note, "(2 of 3 runs ok)")) << r.loss_note;
  EXPECT_TRUE(testing::contains(r.loss_note, "seed 2 ended at loss 1001, above its first 51"))
      << r.loss_note;
}

// Many configurations within the noise of the chosen one: Holm's correction keeps the family
// of "worse" verdicts at 95%, so a p just under 0.05 among several does not count as worse.
TEST(ReportRecommendations, NotWorseUsesHolmsCorrectionOverTheComparisons) {
  FakeRun adam{"vit"};
  adam.eval_every = 5;
  adam.val = [](int) { return 1.0; };
  std::vector<std::vector<FakeRun>> parts = {seeds_of(adam, 3, 0.015)};
  const char* others[] = {"sgd", "adagrad", "adadelta", "cg", "adamw", "lion"};
  for (const char* name : others) {
    FakeRun o = adam;
    o.optimizer = name;
    o.val = [](int) { return 1.04; };  // alone: Welch p about 0.04
    parts.push_back(seeds_of(o, 3, 0.015));
  }
  std::vector<FakeRun> runs;
  for (const auto& p : parts) runs.insert(runs.end(), p.begin(), p.end());
  const WelchTest alone = welch_t_test({1.04 * 0.985, 1.04, 1.04 * 1.015}, {0.985, 1.0, 1.015});
  ASSERT_LT(alone.p, 0.05);
  ASSERT_GT(alone.p, 0.05 / 6);
  const ReportData d = analyze_runs(runs);
  const Recommendation& r = d.recommendations.front();
  ASSERT_TRUE(r.best.has_value());
  EXPECT_EQ(d.groups[*r.best].optimizer, "adam");
  EXPECT_EQ(r.not_worse.size(), 6u);
  // Holm steps down: with one clearly worse (p far below 0.025) and one at p about 0.03, both
  // are worse (0.03 < 0.05 / 1 at the second step), where Bonferroni (0.05 / 2) would list the
  // second.
  FakeRun far = adam;
  far.optimizer = "sgd";
  far.val = [](int) { return 1.3; };
  FakeRun near = adam;
  near.optimizer = "adagrad";
  near.val = [](int) { return 1.04; };
  const ReportData two = analyze_runs(
      all_of({seeds_of(adam, 3, 0.015), seeds_of(far, 3, 0.015), seeds_of(near, 3, 0.015)}));
  const Recommendation& h = two.recommendations.front();
  ASSERT_TRUE(h.best.has_value());
  EXPECT_EQ(two.groups[*h.best].optimizer, "adam");
  EXPECT_TRUE(h.not_worse.empty()) << h.not_worse.size();
}

// A lead within the seeds' spread is no lead: the row lists who the data cannot tell apart.
TEST(ReportRecommendations, ListTheConfigurationsNotSignificantlyWorse) {
  FakeRun adam{"vit"};
  adam.eval_every = 5;
  adam.val = [](int) { return 1.0; };
  FakeRun sgd = adam;  // 0.5% worse, seeds 10% apart: within the spread
  sgd.optimizer = "sgd";
  sgd.val = [](int) { return 1.005; };
  FakeRun adagrad = adam;  // 50% worse, seeds 1% apart: a real lead
  adagrad.optimizer = "adagrad";
  adagrad.val = [](int) { return 1.5; };
  const ReportData d = analyze_runs(
      all_of({seeds_of(adam, 3, 0.1), seeds_of(sgd, 3, 0.1), seeds_of(adagrad, 3, 0.01)}));
  const Recommendation& r = d.recommendations.front();
  ASSERT_TRUE(r.best.has_value());
  EXPECT_EQ(d.groups[*r.best].optimizer, "adam");
  ASSERT_EQ(r.not_worse.size(), 1u);
  EXPECT_EQ(d.groups[r.not_worse[0]].optimizer, "sgd");
  const std::string md = markdown_summary(d);
  EXPECT_TRUE(testing::contains(md, "| " + d.groups[r.not_worse[0]].label + " |")) << md;
  // With two seeds a side nothing can be told apart: every ranked configuration is listed.
  const ReportData two = analyze_runs(
      all_of({seeds_of(adam, 2, 0.1), seeds_of(sgd, 2, 0.1), seeds_of(adagrad, 2, 0.01)}));
  EXPECT_EQ(two.recommendations.front().not_worse.size(), 2u);
}

TEST(ReportRecommendations, TheBestThatFitsEachBudget) {
  const double mib = 1024.0 * 1024;
  FakeRun adam{"vit"};
  adam.peak = 100 * mib;
  adam.loss = [](int, double) { return 0.5; };
  FakeRun sgd = adam;
  sgd.optimizer = "sgd";
  sgd.peak = 80 * mib;
  sgd.loss = [](int, double) { return 1.0; };
  // Checkpointed Adam ran out of memory under a 60 MiB cap.
  FakeRun capped = adam;
  capped.strategy = "checkpoint";
  capped.status = "oom";
  capped.memory_cap = 60 * mib;
  ReportOptions options;
  options.memory_budgets = {static_cast<int64_t>(50 * mib), static_cast<int64_t>(90 * mib),
                            static_cast<int64_t>(200 * mib)};
  const ReportData d = analyze_runs({adam, sgd, capped}, options);
  std::map<double, const Recommendation*> by_budget;
  for (const Recommendation& r : d.recommendations) by_budget[r.budget_bytes / mib] = &r;
  ASSERT_EQ(by_budget.size(), 4u);  // three given and the cap in the data
  EXPECT_FALSE(by_budget.at(50)->best.has_value());
  EXPECT_FALSE(by_budget.at(60)->best.has_value());
  ASSERT_TRUE(by_budget.at(90)->best.has_value());
  EXPECT_EQ(d.groups[*by_budget.at(90)->best].optimizer, "sgd");
  ASSERT_TRUE(by_budget.at(200)->best.has_value());
  EXPECT_EQ(d.groups[*by_budget.at(200)->best].optimizer, "adam");
  EXPECT_DOUBLE_EQ(by_budget.at(200)->best_loss.mean, 0.5);
  EXPECT_EQ(by_budget.at(200)->loss_kind, "training");         // no run evaluated
  EXPECT_NEAR(by_budget.at(200)->time_to_point_s, 2.0, 1e-9);  // 20 steps x 0.1 s
  // The capped run is listed as not fitting, with its reason.
  const auto& misses = by_budget.at(200)->miss_reasons;
  EXPECT_TRUE(std::any_of(misses.begin(), misses.end(), [](const std::string& m) {
    return testing::contains(m, "ran out of memory under a 60.00 MiB cap");
  })) << ::testing::PrintToString(misses);
}

TEST(ReportRecommendations, LatestAttemptWinsAndLabelsTellGroupsApart) {
  FakeRun a{"llama"};
  FakeRun b = a;
  b.status = "diverged";
  std::vector<RunRecord> records = {record_of(b), record_of(a)};  // same run_id: a is latest
  FakeRun lr = a;
  lr.batch = 4;
  records.push_back(record_of(lr));
  const ReportData d = analyze_records(records, {});
  EXPECT_EQ(d.attempts, 3);
  ASSERT_EQ(d.runs.size(), 2u);
  ASSERT_EQ(d.groups.size(), 2u);
  EXPECT_EQ(d.groups[0].statuses, "ok");
  EXPECT_NE(d.groups[0].label, d.groups[1].label);
  EXPECT_TRUE(testing::contains(d.groups[0].label + d.groups[1].label, "batch=4"));
}

TEST(ReportGroups, ASweepsFailureRecordJoinsItsSeeds) {
  // Seeds 0 and 1 ran; seed 2's process died, so the sweep wrote its record: the same
  // configuration and architecture, status crashed, nothing measured.
  FakeRun seed0{"vit"};
  FakeRun seed1 = seed0;
  seed1.seed = 1;
  FakeRun seed2 = seed0;
  seed2.seed = 2;
  const RunRecord measured = record_of(seed2);
  RunRecord crashed;
  crashed.run_id = measured.run_id;
  crashed.attempt_uid = "crashed-attempt";
  crashed.config = measured.config;
  crashed.arch = measured.arch;
  crashed.status = RunStatus::kCrashed;
  crashed.failure = RunFailure{std::nullopt, std::nullopt, "the process was killed"};
  crashed.started_at = "2026-01-01T00:00:00Z";
  crashed.finished_at = "2026-01-01T00:00:05Z";
  testing::TempDir dir("gradscope-report");
  Database db(dir.file("runs.db"));
  db.write_run(record_of(seed0));
  db.write_run(record_of(seed1));
  db.write_run(crashed);
  const ReportData d = analyze(db, {});
  ASSERT_EQ(d.runs.size(), 3u);
  ASSERT_EQ(d.groups.size(), 1u);
  const Group& g = d.groups[0];
  EXPECT_EQ(g.runs.size(), 3u);
  EXPECT_EQ(g.ok_runs.size(), 2u);
  EXPECT_EQ(g.statuses, "crashed, ok x2");
  EXPECT_EQ(g.label, "adam, standard");
  EXPECT_TRUE(g.final_loss.has_interval());  // the ok seeds alone
  // Its row in runs.csv is there, with nothing measured.
  const std::string runs = runs_csv(d);
  EXPECT_EQ(std::count(runs.begin(), runs.end(), '\n'), 4);
  EXPECT_TRUE(testing::contains(runs, ",crashed,,,,,")) << runs;
}

TEST(ReportGroups, AnAttemptWithoutAFinalStatusNeverReplacesOneThatEnded) {
  // The run ended ok; a later attempt of it was stopped (interrupted): the ok one stands. The
  // other way round, the ok attempt that finished the run replaces the stopped one.
  FakeRun run{"llama"};
  const RunRecord ok = record_of(run);
  RunRecord stopped = ok;
  stopped.attempt_uid = "stopped-attempt";
  stopped.status = RunStatus::kInterrupted;
  stopped.failure = RunFailure{3, std::nullopt, "stopped by SIGTERM after step 3"};
  for (const auto& records : {std::vector<RunRecord>{ok, stopped}, {stopped, ok}}) {
    const ReportData d = analyze_records(records, {});
    EXPECT_EQ(d.attempts, 2);
    ASSERT_EQ(d.runs.size(), 1u);
    EXPECT_EQ(d.runs[0].record.status, RunStatus::kOk);
  }
}

TEST(ReportGroups, TwoRunIdsOfOneConfigurationAndSeedCountOnce) {
  // The same experiment stored under two run ids (the default learning rate left out on one,
  // given on the other): one seed, not two, and the later record stands.
  FakeRun first{"llama"};
  first.loss = [](int, double) { return 2.0; };
  FakeRun again = first;
  again.loss = [](int, double) { return 3.0; };
  RunRecord later = record_of(again);
  later.run_id = "another-id-for-the-same-run";
  FakeRun seed1 = first;
  seed1.seed = 1;
  const ReportData d = analyze_records({record_of(first), record_of(seed1), later}, {});
  EXPECT_EQ(d.attempts, 3);
  ASSERT_EQ(d.runs.size(), 2u);
  ASSERT_EQ(d.groups.size(), 1u);
  const Group& g = d.groups[0];
  EXPECT_EQ(g.runs.size(), 2u);
  EXPECT_EQ(d.runs[g.runs[0]].run_id(), "another-id-for-the-same-run");  // seed 0, the later
  EXPECT_DOUBLE_EQ(*d.runs[g.runs[0]].record.final_loss, 3.0);
  // A different seed under its own id stays a run of its own.
  EXPECT_EQ(d.runs[g.runs[1]].seed(), 1u);
}

TEST(ReportGroups, EvaluationSettingsSplitGroupsButLabelOnlyWhenNothingElseDiffers) {
  FakeRun eight{"vit"};
  FakeRun four = eight;
  four.eval_batches = 4;
  const ReportData d = analyze_runs({eight, four});
  ASSERT_EQ(d.groups.size(), 2u);
  std::set<std::string> labels = {d.groups[0].label, d.groups[1].label};
  EXPECT_EQ(labels, (std::set<std::string>{"adam, standard eval_batches=4",
                                           "adam, standard eval_batches=8"}));
  // When the batch tells the groups apart too, the label names the batch alone.
  four.batch = 4;
  const ReportData e = analyze_runs({eight, four});
  ASSERT_EQ(e.groups.size(), 2u);
  labels = {e.groups[0].label, e.groups[1].label};
  EXPECT_EQ(labels, (std::set<std::string>{"adam, standard batch=4", "adam, standard batch=8"}));
}

TEST(ReportRender, CsvColumnsAndMarkdownTables) {
  FakeRun a{"vit"};
  FakeRun b = a;
  b.optimizer = "sgd";
  const ReportData d = analyze_runs({a, b});
  const std::string runs = runs_csv(d);
  EXPECT_EQ(runs.substr(0, runs.find('\n')).rfind("run_id,sweep,configuration,model,preset,", 0),
            0u);
  EXPECT_EQ(std::count(runs.begin(), runs.end(), '\n'), 3);
  const std::string steps = steps_csv(d);
  EXPECT_EQ(steps.substr(0, steps.find('\n')),
            "run_id,step,samples,tokens,evaluations,flops,time_s,energy_j,loss,lr,grad_norm");
  EXPECT_EQ(std::count(steps.begin(), steps.end(), '\n'), 41);
  const std::string md = markdown_summary(d);
  EXPECT_TRUE(testing::contains(md, "## Recommendations"));
  EXPECT_TRUE(testing::contains(md, "| Adam is not the best optimizer everywhere."));
}

// ---- the files of a report ----

bool have_program(const std::string& name) {
  return std::system(("command -v " + name + " >/dev/null 2>&1").c_str()) == 0;
}

bool valid_svg(const std::string& text) {
  return text.rfind("<?xml", 0) == 0 && testing::contains(text, "<svg") &&
         text.find("</svg>") != std::string::npos &&
         text.find_last_not_of(" \n") + 1 == text.find("</svg>") + 6;
}

// PNG signature, an IHDR with nonzero size first and an IEND chunk last.
bool valid_png(const std::string& b) {
  if (b.size() < 57 || b.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) return false;
  if (b.compare(12, 4, "IHDR") != 0) return false;
  auto be32 = [&](size_t at) {
    return (uint32_t(uint8_t(b[at])) << 24) | (uint32_t(uint8_t(b[at + 1])) << 16) |
           (uint32_t(uint8_t(b[at + 2])) << 8) | uint32_t(uint8_t(b[at + 3]));
  };
  return be32(16) > 0 && be32(20) > 0 && b.compare(b.size() - 8, 4, "IEND") == 0;
}

std::map<std::string, std::string> files_under(const fs::path& root) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file())
      files[fs::relative(e.path(), root).string()] = testing::slurp(e.path());
  return files;
}

// ---- text from records stays text ----

TEST(ReportEncode, TextFromRecordsCannotBecomeCode) {
  // gnuplot runs backquotes in double-quoted strings only; a line break would end the command.
  EXPECT_EQ(gnuplot_string("a'b\n`id`"), "'a''b `id`'");
  EXPECT_EQ(gnuplot_datum("a\tb\nc\r"), "a b c ");
  EXPECT_EQ(html_escape("'\"<>&"), "&#39;&quot;&lt;&gt;&amp;");
  EXPECT_EQ(markdown_escape("a\n## b|c"), "a ## b\\|c");
  EXPECT_EQ(markdown_escape("<img src=x> 1 < 2 </b>"), "\\<img src=x> 1 < 2 \\</b>");
  EXPECT_EQ(csv_quote("a\rb"), "\"a\rb\"");
  // Spreadsheet formulas become text; numbers stay numbers.
  EXPECT_EQ(csv_quote("=HYPERLINK(\"http://x\")"), "\"'=HYPERLINK(\"\"http://x\"\")\"");
  EXPECT_EQ(csv_quote("+cmd|' /C calc'!A0"), "'+cmd|' /C calc'!A0");
  EXPECT_EQ(csv_quote("@SUM(A1)"), "'@SUM(A1)");
  EXPECT_EQ(csv_quote("-1+2"), "'-1+2");
  EXPECT_EQ(csv_quote("-1.5e-3"), "-1.5e-3");
  EXPECT_EQ(csv_quote("adam-8bit"), "adam-8bit");
  // A gnuplot data field cannot open a quoted field or comment its line out.
  EXPECT_EQ(gnuplot_datum("\"vit"), "'vit");
  EXPECT_EQ(gnuplot_datum("# vit"), "? vit");
  EXPECT_EQ(gnuplot_datum("\t#vit"), " ?vit");
  EXPECT_EQ(gnuplot_datum("vit#2"), "vit#2");
  // The study's names are their own slugs; anything else is changed and tagged with a hash.
  for (const char* name : {"vit", "modernbert", "llama", "nanovlm", "toy_quadratic"})
    EXPECT_EQ(file_slug(name), name);
  const std::regex slug("[a-z0-9_-]*\\.[0-9a-f]{16}");
  const std::string longest(300, 'a');
  for (const std::string& name :
       {std::string("vit`touch x`"), std::string("../../etc"), std::string(), std::string("ViT"),
        std::string("a b"), std::string("a/b"), longest}) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(std::regex_match(file_slug(name), slug)) << file_slug(name);
    EXPECT_NE(file_slug(name), name);
    EXPECT_LE(file_slug(name).size(), 81u);
    // A name that is already some slug's text keeps itself, and so cannot take that slug.
    const std::string text = file_slug(name).substr(0, file_slug(name).find('.'));
    if (text != name) EXPECT_NE(file_slug(text), file_slug(name));
  }
  EXPECT_NE(file_slug("ViT"), file_slug("vit"));
  EXPECT_NE(file_slug("a b"), file_slug("a-b"));
  EXPECT_NE(file_slug(longest), file_slug(longest + "b"));
  EXPECT_EQ(file_slug("a b"), file_slug("a b"));
}

// A record's model name with gnuplot's backquotes, quotes that would close an HTML attribute
// or a JavaScript string, a path and a line break: the report draws it, runs nothing, writes
// every file inside its folder under a slug name, and shows the name only as text.
TEST(ReportHostile, AModelNameFromARecordRunsNothingAndStaysText) {
  if (!have_program("gnuplot")) GTEST_SKIP() << "gnuplot not installed";
  testing::TempDir dir("gradscope-report-hostile");
  const std::string marker = dir.file("PWNED");
  const std::string hostile = "vit`touch " + marker + "`');alert(1);('\" onmouseover=\"alert(2)" +
                              "<img src=x onerror=alert(3)>/../../escape\nset output";
  FakeRun a{hostile};
  FakeRun b = a;
  b.optimizer = "sgd' `touch " + marker + "2`";
  // A name with nothing but backquotes: gnuplot, which runs in figures/, would run it there.
  FakeRun c{"vit`touch PWNED`"};
  const ReportData data = analyze_runs({a, b, c});
  const fs::path out = dir.fs_path() / "report";
  write_report(data, out.string());
  EXPECT_FALSE(fs::exists(marker));
  EXPECT_FALSE(fs::exists(marker + "2"));
  EXPECT_FALSE(fs::exists(dir.fs_path() / "escape"));
  EXPECT_FALSE(fs::exists(dir.fs_path() / "report" / "figures" / "PWNED"));
  const std::regex figure_file("[a-z0-9_.-]+\\.(svg|png|gp|dat)");
  int figures = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir.fs_path())) {
    if (!e.is_regular_file()) continue;
    const fs::path rel = fs::relative(e.path(), out);
    ASSERT_EQ(rel.begin()->string().rfind("..", 0), std::string::npos) << "outside: " << rel;
    if (rel.parent_path() == "figures") {
      EXPECT_TRUE(std::regex_match(rel.filename().string(), figure_file)) << rel;
      ++figures;
    }
  }
  EXPECT_GT(figures, 8);
  const std::string html = testing::slurp((out / "report.html").string());
  EXPECT_FALSE(testing::contains(html, "onclick"));
  EXPECT_FALSE(testing::contains(html, "onmouseover=\""));
  EXPECT_FALSE(testing::contains(html, "<img src=x"));
  EXPECT_FALSE(testing::contains(html, "alert(1);('"));
  EXPECT_TRUE(testing::contains(html, "&lt;img src=x onerror=alert(3)&gt;"));
  const std::string md = testing::slurp((out / "summary.md").string());
  EXPECT_FALSE(testing::contains(md, "\nset output")) << "a line break in a name ends the cell";
}

// A name that would start a gnuplot data line with '#' (a comment) or open a quoted field:
// its bar would vanish, and a figure of that bar alone would fail to draw.
TEST(ReportHostile, ANameThatLooksLikeAGnuplotCommentIsStillDrawn) {
  if (!have_program("gnuplot")) GTEST_SKIP() << "gnuplot not installed";
  testing::TempDir dir("gradscope-report-comment");
  FakeRun only{"vit"};
  only.optimizer = "#evil \"q";
  const ReportData data = analyze_runs({only});
  EXPECT_NO_THROW(write_report(data, (dir.fs_path() / "report").string()));
}

#ifdef GRADSCOPE_BINARY
// A tiny sweep (two models, two optimizers, standard and accumulation, a second seed for one
// configuration), its report, and the checks the report must pass.
TEST(ReportEndToEnd, ReportOfATinySweepIsCompleteValidAndDeterministic) {
  if (!have_program("gnuplot")) GTEST_SKIP() << "gnuplot not installed";
  testing::TempDir dir("gradscope-report-e2e");
  // The Llama grid on the committed text, then one ViT run.
  const std::string llama = fmt::format(R"(name = "tiny-report"
[sweep]
jobs = 1
[fixed]
model = "llama"
preset = "tiny"
steps = 6
warmup_steps = 1
batch = 4
seq = 32
eval_batches = 1
dataset = "{0}/text/sotu-excerpt.txt"
[axes]
optimizer = ["sgd", "adam"]
strategy = ["standard", "checkpoint", "accumulation"]
seed = [0, 1]
[[override]]
when = {{ strategy = "accumulation" }}
set = {{ accum_steps = 2 }}
)",
                                        GRADSCOPE_FIXTURES);
  std::ofstream(dir.file("llama.toml")) << llama;
  const std::string db = dir.file("runs.db");
  const auto sweep = testing::run_gradscope("sweep " + dir.file("llama.toml") + " --db " + db);
  ASSERT_EQ(sweep.code, 0) << sweep.out << sweep.err;
  const auto vit = testing::run_gradscope(
      "run --model vit --preset tiny --steps 6 --warmup-steps 1 --batch 4 --eval-batches 1 "
      "--quiet --db " +
      db);
  ASSERT_EQ(vit.code, 0) << vit.out << vit.err;
  // The runs' timings as a quiet machine records them: tests share the cores with other
  // suites, and a disturbed run's time would be left out of the time figures this test wants.
  // (ReportDisturbance holds what the report does with disturbed runs.)
  {
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open(db.c_str(), &raw), SQLITE_OK);
    EXPECT_EQ(sqlite3_exec(raw,
                           "UPDATE runs SET record_json = "
                           "json_set(record_json, '$.contention.disturbed', json('false'))",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(raw);
  }

  const std::string out = dir.file("report");
  const auto report = testing::run_gradscope("report " + db + " --out " + out);
  ASSERT_EQ(report.code, 0) << report.out << report.err;
  EXPECT_TRUE(testing::contains(report.out, "13 runs in 7 configurations")) << report.out;

  // Every figure as valid SVG and PNG, with its script and data.
  std::set<std::string> stems;
  for (const auto& e : fs::directory_iterator(fs::path(out) / "figures"))
    stems.insert(e.path().stem().string());
  for (const char* expected :
       {"loss-llama-steps", "loss-llama-samples", "loss-llama-evaluations", "loss-llama-flops",
        "loss-llama-time", "loss-llama-energy", "memory-llama", "phases-llama", "pareto-llama",
        "loss-vit-steps", "utilization", "energy"})
    EXPECT_TRUE(stems.count(expected)) << expected;
  for (const std::string& stem : stems) {
    const fs::path base = fs::path(out) / "figures" / stem;
    EXPECT_TRUE(valid_svg(testing::slurp(base.string() + ".svg"))) << stem;
    EXPECT_TRUE(valid_png(testing::slurp(base.string() + ".png"))) << stem;
    EXPECT_TRUE(fs::exists(base.string() + ".gp")) << stem;
    EXPECT_TRUE(fs::exists(base.string() + ".dat")) << stem;
    EXPECT_FALSE(fs::exists(base.string() + ".log")) << stem;
  }
  // CSV columns.
  const std::string runs = testing::slurp(out + "/runs.csv");
  EXPECT_TRUE(testing::contains(runs.substr(0, runs.find('\n')),
                                "status,final_loss,loss_last_tenth,final_val_loss"));
  EXPECT_EQ(std::count(runs.begin(), runs.end(), '\n'), 14);
  const std::string steps = testing::slurp(out + "/steps.csv");
  EXPECT_EQ(steps.substr(0, steps.find('\n')),
            "run_id,step,samples,tokens,evaluations,flops,time_s,energy_j,loss,lr,grad_norm");
  EXPECT_EQ(std::count(steps.begin(), steps.end(), '\n'), 1 + 13 * 7);
  const std::string claims = testing::slurp(out + "/claims.csv");
  EXPECT_EQ(std::count(claims.begin(), claims.end(), '\n'), 1 + 7);
  // The HTML references no missing file, and inlines one image per figure.
  const std::string html = testing::slurp(out + "/report.html");
  // (Scanned by hand: std::regex recurses per character and overflows on inline images.)
  int inline_images = 0;
  for (const std::string attr : {" src=\"", " href=\""}) {
    for (size_t at = html.find(attr); at != std::string::npos; at = html.find(attr, at + 1)) {
      const size_t from = at + attr.size();
      const std::string target = html.substr(from, html.find('"', from) - from);
      if (target.rfind("data:image/svg+xml;base64,", 0) == 0) {
        ++inline_images;
        continue;
      }
      EXPECT_EQ(target.find("://"), std::string::npos) << "network reference " << target;
      EXPECT_TRUE(fs::exists(fs::path(out) / target)) << "missing " << target;
    }
  }
  EXPECT_EQ(inline_images, static_cast<int>(stems.size()));
  // The same database gives the same bytes.
  const auto again = testing::run_gradscope("report " + db + " --out " + dir.file("again"));
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_TRUE(files_under(out) == files_under(dir.file("again")));

  // Headless Chromium renders it with every figure loaded and the shown ones visible; the
  // screenshot is kept beside the test binary as a build artifact.
  std::string chromium;
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"})
    if (chromium.empty() && have_program(name)) chromium = name;
  if (chromium.empty()) GTEST_SKIP() << "no chromium to render the report with";
  const std::string flags =
      " --headless --no-sandbox --disable-gpu --hide-scrollbars --virtual-time-budget=5000 ";
  const std::string url = "file://" + fs::absolute(out + "/report.html").string();
  const std::string dom = dir.file("dom.html");
  ASSERT_EQ(
      std::system((chromium + flags + "--dump-dom " + url + " >" + dom + " 2>/dev/null").c_str()),
      0);
  const std::string rendered = testing::slurp(dom);
  auto attr = [&](const std::string& name) {
    std::smatch m;
    const std::regex re(name + "=\"([0-9]+)\"");
    return std::regex_search(rendered, m, re) ? std::stoi(m[1]) : -1;
  };
  EXPECT_EQ(attr("data-figures-total"), static_cast<int>(stems.size()));
  EXPECT_EQ(attr("data-figures-loaded"), attr("data-figures-total"));
  EXPECT_GT(attr("data-figures-meant"), 0);
  EXPECT_EQ(attr("data-figures-visible"), attr("data-figures-meant"));
  const fs::path artifacts = fs::path(GRADSCOPE_BINARY).parent_path() / "artifacts";
  fs::create_directories(artifacts);
  const std::string shot = (artifacts / "report-screenshot.png").string();
  fs::remove(shot);
  ASSERT_EQ(std::system((chromium + flags + "--window-size=1400,3000 --screenshot=" + shot + " " +
                         url + " >/dev/null 2>&1")
                            .c_str()),
            0);
  EXPECT_TRUE(valid_png(testing::slurp(shot)));
}

TEST(ReportEndToEnd, UsageErrors) {
  testing::TempDir dir("gradscope-report-cli");
  auto r = testing::run_gradscope("report " + dir.file("missing.db") + " --out " + dir.file("o"));
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(testing::contains(r.err, "no database at")) << r.err;
  { Database db(dir.file("empty.db")); }
  r = testing::run_gradscope("report " + dir.file("empty.db") + " --out " + dir.file("o"));
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(testing::contains(r.err, "holds no runs")) << r.err;
  r = testing::run_gradscope("report " + dir.file("empty.db"));
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(testing::contains(r.err, "needs --out")) << r.err;
}
#endif

}  // namespace
}  // namespace gradscope
