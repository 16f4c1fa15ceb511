// What a sweep and collect do with input from elsewhere and with each other: result files
// that are not run records are named and skipped while the good ones are merged; one sweep
// at a time per database; no axis over a setting outside the run id.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "gradscope/cli/commands.h"
#include "gradscope/core/record.h"
#include "gradscope/store/db.h"
#include "gradscope/sweep/grid.h"
#include "gradscope/sweep/runner.h"
#include "test_util.h"

namespace gradscope {
namespace {

using testing::result_record;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(CollectHostile, BadFilesAreNamedAndSkippedAndTheGoodOnesMerged) {
  testing::TempDir dir;
  const std::string results = dir.file("results");
  std::filesystem::create_directory(results);
  write_text(results + "/a-good.json", record_to_json(result_record("aaaa")).dump());
  write_text(results + "/b-not-json.json", "{\"schema\": ");
  // A record whose free-form "data" nests 200000 levels: parsing it works, storing it (dump)
  // would recurse once per level.
  const std::string good = record_to_json(result_record("bbbb")).dump();
  write_text(results + "/c-deep.json",
             good.substr(0, good.size() - 1) + ", \"data\": " + std::string(200000, '[') +
                 std::string(200000, ']') + "}");  // the last "data" is the one kept
  nlohmann::json wrong = record_to_json(result_record("cccc"));
  wrong["final_loss"] = "low";  // a field of the wrong type
  write_text(results + "/d-wrong-type.json", wrong.dump());
  nlohmann::json no_uid = record_to_json(result_record("dddd"));
  no_uid.erase("attempt_uid");
  write_text(results + "/e-no-attempt.json", no_uid.dump());
  nlohmann::json odd_id = record_to_json(result_record("eeee"));
  odd_id["run_id"] = "x'; DROP TABLE runs; --";
  write_text(results + "/f-odd-id.json", odd_id.dump());
  write_text(results + "/g-good.json", record_to_json(result_record("gggg")).dump());
  // A sparse file far over the size a record may have: refused by its size, not read.
  write_text(results + "/h-huge.json", "");
  ASSERT_EQ(::truncate((results + "/h-huge.json").c_str(), kMaxRecordBytes + 1), 0);

  Database db(dir.file("r.db"));
  const CollectReport r = collect_results(dir.path(), db);
  EXPECT_EQ(r.merged, 2);
  ASSERT_EQ(r.refused.size(), 6u);
  const std::vector<std::string> expected = {"b-not-json.json: it is not valid JSON",
                                             "c-deep.json: it nests arrays and objects deeper",
                                             "d-wrong-type.json: ",
                                             "e-no-attempt.json: it has no attempt_uid",
                                             "f-odd-id.json: run record has the run_id",
                                             "h-huge.json: "};
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_TRUE(testing::contains(r.refused[i], expected[i])) << r.refused[i];
  EXPECT_TRUE(testing::contains(r.refused[2], "final_loss")) << r.refused[2];
  EXPECT_TRUE(testing::contains(r.refused[5], "more than")) << r.refused[5];
  // The merged records read back, and a report's reader sees only those two.
  std::vector<std::string> unreadable;
  EXPECT_EQ(db.records(&unreadable).size(), 2u);
  EXPECT_TRUE(unreadable.empty());
  // Collecting again stores nothing twice and refuses the same files.
  const CollectReport again = collect_results(dir.path(), db);
  EXPECT_EQ(again.merged, 0);
  EXPECT_EQ(again.present, 2);
  EXPECT_EQ(again.refused.size(), 6u);
}

TEST(CollectHostile, ALateMergedOlderAttemptDoesNotHideTheNewerOne) {
  testing::TempDir dir;
  Database db(dir.file("r.db"));
  RunRecord newer = result_record("same");
  newer.started_at = "2026-03-01T00:00:00Z";
  newer.final_loss = 1.0;
  db.write_run(newer);
  RunRecord older = result_record("same");
  older.started_at = "2026-02-01T00:00:00Z";
  older.final_loss = 9.0;
  db.write_run(older);  // stored later, as collect may
  EXPECT_EQ(db.latest_record("same")->final_loss, 1.0);
  const auto all = db.records();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all.back().final_loss, 1.0);  // later records win in the report
}

// A child that finished and wrote its record file but could not store it (the database was
// locked or refused it, and it exited 1): the sweep stores the run from the file instead of
// writing it off as crashed.
TEST(SweepReap, AChildsRecordFileIsStoredWhenTheChildCouldNotStoreIt) {
  testing::TempDir dir;
  const std::string file = dir.file("one.toml");
  write_text(file,
             "name = \"one\"\n[fixed]\nmodel = \"llama\"\npreset = \"tiny\"\nseq = 32\n"
             "[axes]\noptimizer = [\"sgd\"]\n");
  const Sweep sweep = load_sweep(file);
  Database db(dir.file("r.db"));
  std::vector<PlannedRun> plan = plan_sweep(sweep, db, parse_run_arguments);
  ASSERT_EQ(plan.size(), 1u);
  RunRecord finished = result_record(plan[0].run_id);
  finished.sweep = sweep.name;
  write_text(dir.file("finished.json"), record_to_json(finished).dump());
  // Stands in for `gradscope run`: writes its --json file, then fails as a refused database
  // write makes it fail.
  const std::string child = dir.file("child.sh");
  write_text(child, "#!/bin/sh\nwhile [ $# -gt 0 ]; do\n  if [ \"$1\" = --json ]; then cp " +
                        dir.file("finished.json") +
                        " \"$2\"; fi\n  shift\ndone\necho 'error: database is locked' >&2\n"
                        "exit 1\n");
  std::filesystem::permissions(child, std::filesystem::perms::owner_all);
  SweepOptions o;
  o.db_path = dir.file("r.db");
  o.executable = child;
  o.log_dir = dir.file("logs");
  o.heartbeat_s = 0;
  o.out = std::fopen("/dev/null", "w");
  ASSERT_NE(o.out, nullptr);
  const int64_t failed = run_sweep(sweep, plan, db, o);
  std::fclose(o.out);
  EXPECT_EQ(failed, 0);
  const std::vector<RunRecord> stored = db.records();
  ASSERT_EQ(stored.size(), 1u);
  EXPECT_EQ(stored[0].status, RunStatus::kOk);
  EXPECT_EQ(stored[0].attempt_uid, finished.attempt_uid);
  EXPECT_EQ(stored[0].final_loss, 2.5);
}

TEST(SweepAxes, TwoRunsOfOneRunIdAreRefusedNamingBoth) {
  testing::TempDir dir;
  const std::string file = dir.file("same.toml");
  write_text(file,
             "[fixed]\nmodel = \"llama\"\npreset = \"tiny\"\nseq = 32\n[axes]\n"
             "seed = [1, 2]\n[[override]]\nwhen = { seed = 2 }\nset = { seed = 1 }\n");
  const Sweep sweep = load_sweep(file);
  Database db(dir.file("r.db"));
  const Error e = testing::expect_usage_error([&] { plan_sweep(sweep, db, parse_run_arguments); });
  EXPECT_TRUE(testing::contains(e.what(), "runs 1 (seed=1) and 2 (seed=1) are the same run"))
      << e.what();
}

TEST(SweepAxes, ValuesAndNamesCannotCarryControlCharacters) {
  testing::TempDir dir;
  const std::string file = dir.file("ctl.toml");
  write_text(file, "[fixed]\nmodel = \"llama\"\ndataset = \"a\\n; touch x; #\"\n");
  const Error e = testing::expect_usage_error([&] { load_sweep(file); });
  EXPECT_TRUE(testing::contains(e.what(), "control character")) << e.what();
  write_text(file, "name = \"x\\ntouch PWNED\"\n[fixed]\nmodel = \"llama\"\n");
  testing::expect_usage_error([&] { load_sweep(file); });
  write_text(dir.file("we ird$(x).toml"), "[fixed]\nmodel = \"llama\"\n");
  EXPECT_EQ(load_sweep(dir.file("we ird$(x).toml")).name, "we-ird--x-");
}

// toml++ 3.3 reaches undefined behaviour on some characters beyond ASCII outside strings
// (found by fuzzing): they are refused before it parses, with line and column.
TEST(SweepAxes, CharactersBeyondAsciiOutsideStringsAreRefused) {
  testing::TempDir dir;
  const std::string file = dir.file("u.toml");
  write_text(file, "[fixed]\nmodel = \"llama\"\nseq = 1\xc2\xa7\n");
  const Error e = testing::expect_usage_error([&] { load_sweep(file); });
  EXPECT_TRUE(testing::contains(e.what(), file + ":3:8: a character beyond ASCII")) << e.what();
  // In strings of every kind and in comments they are text.
  write_text(file,
             "# caf\xc3\xa9\nname = \"x\"\n[fixed]\nmodel = 'llama' # \xc2\xa7\n"
             "[fixed.opt]\na = \"\\\"\xc2\xa7\"\nb = \"\"\"\xc2\xa7\"\"\"\"\"\n"
             "c = '''\xc2\xa7'''\n");
  EXPECT_EQ(load_sweep(file).runs.size(), 1u);
}

TEST(SweepAxes, BackslashesAndByteOrderMarksInTomlAreReadAsTomlReadsThem) {
  testing::TempDir dir;
  const std::string file = dir.file("b.toml");
  // toml++ looks for whitespace after a backslash in a basic string: refused there.
  for (const std::string& value :
       {std::string("\"\"\"\\\n  \xc3\xa9x.txt\"\"\""), std::string("\"\"\"\\\xc3\xa9\"\"\""),
        std::string("\"\\\xc3\xa9\"")}) {
    write_text(file, "[fixed]\nmodel = \"llama\"\ndataset = " + value + "\n");
    const Error e = testing::expect_usage_error([&] { load_sweep(file); });
    EXPECT_TRUE(testing::contains(e.what(), "right after a")) << e.what();
  }
  // A line-ending backslash before the closing quotes, and the lines counted after it.
  write_text(file, "[fixed]\nmodel = \"\"\"lla\\\n  ma\\\n\"\"\"\nseq = 1\xc2\xa7\n");
  const Error e = testing::expect_usage_error([&] { load_sweep(file); });
  EXPECT_TRUE(testing::contains(e.what(), file + ":5:8:")) << e.what();
  // A byte order mark, which toml++ skips, is not text.
  write_text(file, "\xef\xbb\xbf[fixed]\nmodel = \"llama\"\n");
  EXPECT_EQ(load_sweep(file).runs.size(), 1u);
}

TEST(SweepLockTest, ASecondSweepOnOneDatabaseIsRefusedNamingTheFirst) {
  testing::TempDir dir;
  const std::string db = dir.file("r.db");
  {
    SweepLock first(db);
    const Error e = testing::expect_usage_error([&] { SweepLock second(db); });
    EXPECT_TRUE(testing::contains(e.what(), "another sweep is running on " + db)) << e.what();
    EXPECT_TRUE(testing::contains(e.what(), fmt::format("pid {}", getpid()))) << e.what();
    SweepLock other(dir.file("other.db"));  // another database is another lock
  }
  SweepLock after(db);  // released with the first
}

TEST(SweepLockTest, TwoSpellingsOfOneDatabaseTakeOneLock) {
  testing::TempDir dir;
  const std::string db = dir.file("real.db");
  { Database create(db); }
  std::filesystem::create_symlink("real.db", dir.file("link.db"));
  SweepLock first(db);
  testing::expect_usage_error([&] { SweepLock second(dir.file("link.db")); });
  testing::expect_usage_error([&] { SweepLock third(dir.path() + "/./real.db"); });
}

TEST(SweepLockTest, TheLockFileIsNotFollowedThroughALink) {
  testing::TempDir dir;
  write_text(dir.file("victim.txt"), "keep me");
  std::filesystem::create_symlink("victim.txt", dir.file("r.db.sweep-lock"));
  testing::expect_usage_error([&] { SweepLock lock(dir.file("r.db")); });
  EXPECT_EQ(testing::slurp(dir.file("victim.txt")), "keep me");
}

TEST(CollectHostile, RefusedTaskFilesCountAsMissing) {
  testing::TempDir dir;
  std::filesystem::create_directory(dir.file("results"));
  nlohmann::json runs = {{"format", "gradscope-slurm-runs"}, {"version", 1}, {"sweep", "s"}};
  for (int i = 0; i < 2; ++i)
    runs["runs"].push_back({{"index", i},
                            {"run_id", "r" + std::to_string(i)},
                            {"label", "x"},
                            {"nproc", 1},
                            {"sets_threads", false},
                            {"args", nlohmann::json::array({"--model", "llama"})}});
  write_text(dir.file("runs.json"), runs.dump());
  write_text(dir.file("results/task-0.json"), record_to_json(result_record("r0")).dump());
  write_text(dir.file("results/task-1.json"), "not json");
  Database db(dir.file("r.db"));
  CollectReport r = collect_results(dir.path(), db);
  EXPECT_EQ(r.expected, 2);
  EXPECT_EQ(r.missing, std::vector<std::string>{"1"});
  EXPECT_TRUE(r.interrupted.empty());
  // A file named for task 1 that holds another run (an earlier grid's) does not count.
  write_text(dir.file("results/task-1.j7.json"), record_to_json(result_record("zz")).dump());
  r = collect_results(dir.path(), db);
  EXPECT_EQ(r.missing, std::vector<std::string>{"1"});
  std::filesystem::remove(dir.file("results/task-1.j7.json"));
  // A task stopped by its requeue and not yet finished is not done; its resumed attempt
  // (task-I.rK.json) finishes it.
  RunRecord stopped = result_record("r1");
  stopped.status = RunStatus::kInterrupted;
  write_text(dir.file("results/task-1.json"), record_to_json(stopped).dump());
  r = collect_results(dir.path(), db);
  EXPECT_TRUE(r.missing.empty());
  EXPECT_EQ(r.interrupted, std::vector<std::string>{"1"});
  RunRecord resumed = result_record("r1");
  write_text(dir.file("results/task-1.r1.json"), record_to_json(resumed).dump());
  r = collect_results(dir.path(), db);
  EXPECT_TRUE(r.missing.empty());
  EXPECT_TRUE(r.interrupted.empty());
  EXPECT_EQ(r.merged, 1);
  EXPECT_EQ(r.present, 2);
  // A damaged runs.json: the files are still merged, the count is not made.
  write_text(dir.file("runs.json"), "{\"format\": 1}");
  r = collect_results(dir.path(), db);
  EXPECT_EQ(r.expected, -1);
  EXPECT_FALSE(r.runs_file_error.empty());
}

TEST(CollectHostile, RecordsWithRepeatedStepsOrOddTimesAreRefused) {
  RunRecord twice = result_record("x");
  twice.steps.resize(2);
  twice.steps[0].step = twice.steps[1].step = 3;
  testing::expect_usage_error([&] { record_from_json(record_to_json(twice)); });
  for (const std::string& when : {"2026-01-01 00:00:00", "9999", "2026-01-01T00:00:00+01:00"}) {
    nlohmann::json j = record_to_json(result_record("y"));
    j["started_at"] = when;
    testing::expect_usage_error([&] { record_from_json(j); });
  }
}

TEST(SweepAxes, ASettingOutsideTheRunIdCannotBeAnAxis) {
  testing::TempDir dir;
  for (const std::string key : {"threads", "sample_period", "timeout"}) {
    const std::string file = dir.file(key + ".toml");
    write_text(file,
               "[fixed]\nmodel = \"llama\"\npreset = \"tiny\"\n[axes]\noptimizer = "
               "[\"sgd\", \"adam\"]\n" +
                   key + " = [1, 2]\n");
    const Error e = testing::expect_usage_error([&] { load_sweep(file); });
    EXPECT_TRUE(testing::contains(e.what(), "'" + key + "' cannot be an axis")) << e.what();
    EXPECT_TRUE(testing::contains(e.what(), file)) << e.what();
  }
  // In [fixed] it is fine.
  const std::string file = dir.file("fixed.toml");
  write_text(file,
             "[fixed]\nmodel = \"llama\"\npreset = \"tiny\"\nthreads = 1\n[axes]\noptimizer = "
             "[\"sgd\", \"adam\"]\n");
  EXPECT_EQ(load_sweep(file).runs.size(), 2u);
}

}  // namespace
}  // namespace gradscope
