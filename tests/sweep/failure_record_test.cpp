// The records of one configuration, however they were written: by the run, by the sweep for
// an attempt that ended without one, and merged from a result file by collect. All parse into
// the typed record, and a run the sweep gave up on is filed with its configuration's seeds.
#include <gtest/gtest.h>

#include <fstream>

#include "gradscope/cli/commands.h"
#include "gradscope/core/record.h"
#include "gradscope/report/analysis.h"
#include "gradscope/store/db.h"
#include "gradscope/sweep/grid.h"
#include "gradscope/sweep/runner.h"
#include "gradscope/train/trainer.h"
#include "test_util.h"

namespace gradscope {
namespace {

TEST(SweepFailureRecord, AGivenUpRunIsFiledWithItsConfigurationsSeeds) {
  testing::TempDir dir;
  const std::string file = dir.file("seeds.toml");
  {
    std::ofstream out(file);
    out << "name = \"seeds\"\n[fixed]\nmodel = \"llama\"\npreset = \"tiny\"\nseq = 32\n"
           "steps = 2\nwarmup_steps = 0\neval_batches = 1\nsample_period = 0\ndataset = \""
        << testing::fixture("text/sotu-excerpt.txt") << "\"\n[axes]\nseed = [0, 1]\n";
  }
  const Sweep sweep = load_sweep(file);
  Database db(dir.file("seeds.db"));
  std::vector<PlannedRun> plan = plan_sweep(sweep, db, parse_run_arguments);
  ASSERT_EQ(plan.size(), 2u);

  // Seed 0 ends ok with the record its run writes; seed 1 is killed twice and given up, the
  // sweep writing each attempt's record.
  RunRecord ok = Trainer(plan[0].resolved.given).run();
  ASSERT_TRUE(ok.ok());
  ok.attempt_uid = new_attempt_uid();
  ok.sweep = sweep.name;
  db.write_run(ok);
  for (int attempt = 0; attempt < 2; ++attempt)
    db.write_run(failure_record(plan[1], sweep.name, RunStatus::kCrashed,
                                "killed by signal 9 (Killed)", dir.file("log"),
                                "2026-01-01T00:00:00Z", 1.5, 2));
  EXPECT_EQ(db.statuses_of(plan[1].run_id),
            (std::vector<RunStatus>{RunStatus::kCrashed, RunStatus::kCrashed}));

  // The failure record carries the configuration as the run resolves it.
  const RunRecord given_up = db.latest_record(plan[1].run_id).value();
  EXPECT_EQ(given_up.schema, kRunSchema);
  EXPECT_EQ(given_up.config.lr, ok.config.lr);
  EXPECT_EQ(given_up.config.seq_len, ok.config.seq_len);
  EXPECT_EQ(given_up.config.dataset, ok.config.dataset);
  EXPECT_EQ(given_up.config.tokenizer, ok.config.tokenizer);
  EXPECT_EQ(given_up.arch, ok.arch);
  EXPECT_EQ(given_up.config.threads, 2);
  ASSERT_TRUE(given_up.time.has_value());
  EXPECT_EQ(given_up.time->wall_s, 1.5);
  EXPECT_FALSE(given_up.time->total_s.has_value());
  EXPECT_FALSE(given_up.memory.has_value());

  // Both seeds are one configuration in the report, the given-up one among its runs.
  const ReportData data = analyze(db, ReportOptions{});
  ASSERT_EQ(data.groups.size(), 1u);
  EXPECT_EQ(data.groups[0].runs.size(), 2u);
  EXPECT_EQ(data.groups[0].ok_runs.size(), 1u);

  // A result file merged by collect parses into the same struct.
  testing::TempDir results;
  RunRecord collected = ok;
  collected.attempt_uid = new_attempt_uid();
  {
    std::ofstream out(results.file("task-0.json"));
    out << record_to_json(collected).dump(2);
  }
  const CollectReport merged = collect_results(results.path(), db);
  EXPECT_EQ(merged.merged, 1);
  const RunRecord back = db.latest_record(plan[0].run_id).value();
  EXPECT_EQ(back.attempt_uid, collected.attempt_uid);
  EXPECT_EQ(record_to_json(back), record_to_json(collected));
}

}  // namespace
}  // namespace gradscope
