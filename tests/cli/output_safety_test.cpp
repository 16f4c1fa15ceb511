// Output paths lose nothing: no command writes over a file that is not an earlier output of the
// same kind (a results database given as --json, a user's runs.csv in a report folder), one
// path given for two outputs is refused, and all of it before anything trains or is written.
// A results database from elsewhere whose triggers would delete or rewrite a stored run is
// refused by every command that opens it; a sweep refused while it is checked writes no
// database.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "gradscope/core/json_input.h"
#include "gradscope/core/record.h"
#include "gradscope/store/db.h"
#include "test_util.h"

namespace gradscope {
namespace output_safety {
namespace {

namespace fs = std::filesystem;
using testing::contains;
using testing::run_gradscope;
using testing::slurp;

const std::string kTinyRun = "run --model llama --preset tiny --seq 32 --batch 2 --steps 2 "
                             "--warmup-steps 0 --eval-batches 1 --quiet --threads 1 --dataset " +
                             testing::fixture("text/sotu-excerpt.txt");

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

void sql(const std::string& path, const std::string& statements) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* message = nullptr;
  EXPECT_EQ(sqlite3_exec(db, statements.c_str(), nullptr, nullptr, &message), SQLITE_OK)
      << (message ? message : "");
  sqlite3_free(message);
  sqlite3_close(db);
}

// A results database with one run in it, made by `gradscope run`.
std::string results_database(const testing::TempDir& dir, const std::string& name) {
  const std::string path = dir.file(name);
  const auto made = run_gradscope(kTinyRun + " --db " + path);
  EXPECT_EQ(made.code, 0) << made.err;
  return path;
}

TEST(OutputSafety, RunRefusesOutputPathsThatHoldSomethingElse) {
  testing::TempDir dir("gradscope-outputs");
  const std::string db = results_database(dir, "a.db");
  const std::string db_bytes = slurp(db);

  // --json naming a results database: refused before training, the database untouched.
  auto r = run_gradscope(kTinyRun + " --json " + db + " --db " + dir.file("b.db"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "--json " + db)) << r.err;
  EXPECT_TRUE(contains(r.err, "SQLite database")) << r.err;
  EXPECT_EQ(slurp(db), db_bytes);
  EXPECT_FALSE(fs::exists(dir.file("b.db")));

  // One path for --json and --db.
  r = run_gradscope(kTinyRun + " --json " + dir.file("x") + " --db " + dir.file("x"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "--json") && contains(r.err, "--db") &&
              contains(r.err, "same file"))
      << r.err;
  EXPECT_FALSE(fs::exists(dir.file("x")));
  // ... spelled two ways, or through a link.
  fs::create_symlink(db, dir.file("link.db"));
  r = run_gradscope(kTinyRun + " --db " + db + " --json " + dir.file("link.db"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(slurp(db), db_bytes);

  // A file of the user's as --json or --db, or an output inside the state folder.
  write_text(dir.file("notes.txt"), "my notes\n");
  r = run_gradscope(kTinyRun + " --no-db --json " + dir.file("notes.txt"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "not a gradscope run record")) << r.err;
  r = run_gradscope(kTinyRun + " --db " + dir.file("notes.txt"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "--db " + dir.file("notes.txt"))) << r.err;
  EXPECT_EQ(slurp(dir.file("notes.txt")), "my notes\n");
  fs::create_directory(dir.file("state"));
  r = run_gradscope(kTinyRun + " --no-db --save-state " + dir.file("state") + " --json " +
                    dir.file("state/r.json"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "lies inside --save-state")) << r.err;

  // An earlier record is an output of the same kind: written over.
  r = run_gradscope(kTinyRun + " --db " + db + " --json " + dir.file("r.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  r = run_gradscope(kTinyRun + " --db " + db + " --json " + dir.file("r.json"));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(Database(db).count_runs(), 3);
}

TEST(OutputSafety, OtherCommandsRefuseOutputPathsThatHoldSomethingElse) {
  testing::TempDir dir("gradscope-outputs");
  const std::string db = results_database(dir, "a.db");
  const std::string db_bytes = slurp(db);
  for (const std::string& command :
       {std::string("estimate --model llama --preset tiny --no-data --json "),
        "eval --model llama --preset tiny --seq 32 --eval-batches 1 --dataset " +
            testing::fixture("text/sotu-excerpt.txt") + " --json ",
        std::string("probe --seconds 0.05 --no-db --json ")}) {
    const auto r = run_gradscope(command + db);
    EXPECT_EQ(r.code, 2) << command << r.err;
    EXPECT_TRUE(contains(r.err, "--json " + db)) << command << r.err;
  }
  auto r = run_gradscope("probe --seconds 0.05 --json " + dir.file("p") + " --db " +
                         dir.file("p"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(slurp(db), db_bytes);

  // report --out: a folder holding a runs.csv of the user's, or a file.
  fs::create_directory(dir.file("mine"));
  write_text(dir.file("mine/runs.csv"), "name,score\nx,1\n");
  r = run_gradscope("report " + db + " --format csv --out " + dir.file("mine"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "runs.csv")) << r.err;
  EXPECT_EQ(slurp(dir.file("mine/runs.csv")), "name,score\nx,1\n");
  r = run_gradscope("report " + db + " --format md --out " + db);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(slurp(db), db_bytes);
  // A report's own folder is written again.
  r = run_gradscope("report " + db + " --format csv --out " + dir.file("report"));
  ASSERT_EQ(r.code, 0) << r.err;
  r = run_gradscope("report " + db + " --format csv --out " + dir.file("report"));
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST(OutputSafety, ADatabaseWithTriggersIsRefusedByEveryCommand) {
  testing::TempDir dir("gradscope-triggers");
  const std::string db = results_database(dir, "t.db");
  sql(db,
      "CREATE TRIGGER t AFTER INSERT ON runs BEGIN DELETE FROM runs WHERE attempt_id = "
      "NEW.attempt_id; END; CREATE TRIGGER f AFTER INSERT ON runs BEGIN UPDATE runs SET "
      "final_loss = 0.001 WHERE attempt_id = NEW.attempt_id; END;");
  // A result file for collect.
  fs::create_directory(dir.file("results"));
  auto r = run_gradscope(kTinyRun + " --no-db --json " + dir.file("results/a.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string sweep = dir.file("s.toml");
  write_text(sweep, "name = \"s\"\n[fixed]\nmodel = \"llama\"\npreset = \"tiny\"\nseq = 32\n"
                    "batch = 2\nsteps = 2\nwarmup_steps = 0\neval_batches = 1\ndataset = \"" +
                        testing::fixture("text/sotu-excerpt.txt") +
                        "\"\n[axes]\noptimizer = [\"sgd\"]\n");
  for (const std::string& command :
       {kTinyRun + " --db " + db, "report " + db + " --format md", "collect " +
        dir.file("results") + " --db " + db, "sweep " + sweep + " --db " + db,
        std::string("probe --seconds 0.05 --db ") + db}) {
    r = run_gradscope(command);
    EXPECT_EQ(r.code, 2) << command << "\n" << r.out << r.err;
    EXPECT_TRUE(contains(r.err, "trigger") && contains(r.err, "'t' on 'runs'") &&
                contains(r.err, "'f' on 'runs'"))
        << command << "\n" << r.err;
  }
  sqlite3* handle = nullptr;
  ASSERT_EQ(sqlite3_open_v2(db.c_str(), &handle, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(handle, "SELECT count(*) FROM runs", -1, &stmt, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(stmt, 0), 1);
  sqlite3_finalize(stmt);
  sqlite3_close(handle);
}

TEST(OutputSafety, ASweepRefusedWhileCheckedWritesNoDatabase) {
  testing::TempDir dir("gradscope-sweep-refused");
  const std::string sweep = dir.file("bad.toml");
  write_text(sweep, "name = \"bad\"\n[fixed]\nmodel = \"llama\"\npreset = \"tiny\"\nsteps = 2\n"
                    "dataset = \"" + testing::fixture("text/sotu-excerpt.txt") +
                        "\"\n[axes]\nlr = [0.001, -1.0]\n");
  auto r = run_gradscope("sweep " + sweep + " --db " + dir.file("new.db"));
  EXPECT_EQ(r.code, 2) << r.err;
  for (const char* suffix : {"", "-wal", "-shm", "-journal", ".sweep-lock"})
    EXPECT_FALSE(fs::exists(dir.file(std::string("new.db") + suffix))) << suffix;
  // An existing database is left as it was; so is one named by --only that the grid lacks.
  const std::string db = results_database(dir, "old.db");
  const std::string before = slurp(db);
  r = run_gradscope("sweep " + sweep + " --db " + db);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(slurp(db), before);
  write_text(sweep, "name = \"ok\"\n[fixed]\nmodel = \"llama\"\npreset = \"tiny\"\nsteps = 2\n"
                    "dataset = \"" + testing::fixture("text/sotu-excerpt.txt") +
                        "\"\n[axes]\nlr = [0.001]\n");
  r = run_gradscope("sweep " + sweep + " --only no-such-run --db " + dir.file("only.db"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_FALSE(fs::exists(dir.file("only.db")));
}

}  // namespace
}  // namespace output_safety
}  // namespace gradscope
