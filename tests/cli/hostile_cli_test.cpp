// The command line against input from elsewhere and against its own environment changing:
// collect with files that are not run records, a second sweep on one database, the binary
// replaced while a sweep runs, and a report of a database this user cannot write.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "gradscope/core/record.h"
#include "gradscope/store/db.h"
#include "gradscope/sweep/runner.h"
#include "test_util.h"

namespace gradscope {
namespace {

namespace fs = std::filesystem;
using testing::contains;
using testing::run_gradscope;
using testing::slurp;

const std::string kHostileRun =
    std::string(
        "run --model llama --preset tiny --seq 32 --batch 2 --warmup-steps 0 "
        "--eval-batches 1 --quiet --dataset ") +
    GRADSCOPE_FIXTURES + "/text/sotu-excerpt.txt";

// A sweep file of the tiny Llama with SGD and Adam, `steps` steps each.
std::string two_run_sweep(const testing::TempDir& dir, int64_t steps) {
  const std::string path = dir.file("two.toml");
  std::ofstream(path) << "name = \"two\"\n[fixed]\nmodel = \"llama\"\npreset = \"tiny\"\n"
                      << "seq = 32\nbatch = 2\neval_batches = 1\nwarmup_steps = 0\nsteps = "
                      << steps << "\ndataset = \"" << testing::fixture("text/sotu-excerpt.txt")
                      << "\"\n[axes]\noptimizer = [\"sgd\", \"adam\"]\n";
  return path;
}

int64_t ok_runs(const std::string& db_path) {
  Database db(db_path);
  int64_t n = 0;
  for (const RunRecord& r : db.records()) n += r.ok() ? 1 : 0;
  return n;
}

TEST(HostileCli, CollectMergesTheGoodFilesAndExitsTwoNamingTheBadOnes) {
  testing::TempDir dir("gradscope-collect");
  const std::string results = dir.file("results");
  fs::create_directory(results);
  auto run = run_gradscope(kHostileRun + " --steps 2 --no-db --json " + results + "/a.json");
  ASSERT_EQ(run.code, 0) << run.err;
  std::ofstream(results + "/b.json") << std::string(100000, '[');
  std::ofstream(results + "/c\x1b[31m.json") << "{}";  // a name that would color the terminal
  const auto r = run_gradscope("collect " + dir.path() + " --db " + dir.file("m.db"));
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "merged 1 result file")) << r.out;
  EXPECT_TRUE(contains(r.err, "refused: " + results + "/b.json: it nests")) << r.err;
  EXPECT_TRUE(contains(r.err, "c?[31m.json")) << r.err;
  EXPECT_FALSE(contains(r.err, "\x1b")) << r.err;
  EXPECT_TRUE(contains(r.err, "2 files were not merged")) << r.err;
  EXPECT_EQ(ok_runs(dir.file("m.db")), 1);
}

TEST(HostileCli, CollectsRunningAtOnceStoreEachAttemptOnce) {
  testing::TempDir dir("gradscope-collects");
  fs::create_directory(dir.file("results"));
  for (int i = 0; i < 40; ++i)
    std::ofstream(dir.file(fmt::format("results/task-{}.json", i)))
        << record_to_json(testing::result_record(fmt::format("run{}", i))).dump();
  const std::string db = dir.file("m.db");
  { Database create(db); }
  std::vector<pid_t> pids;
  for (int c = 0; c < 3; ++c) {
    const pid_t pid = fork();
    if (pid == 0) {
      const std::string cmd = fmt::format("exec {} collect {} --db {} >/dev/null 2>&1",
                                          GRADSCOPE_BINARY, dir.path(), db);
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    pids.push_back(pid);
  }
  for (const pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  Database check(db);
  EXPECT_EQ(check.count_runs(), 40);
}

TEST(HostileCli, ASecondSweepOnOneDatabaseIsRefused) {
  testing::TempDir dir("gradscope-lock");
  const std::string file = two_run_sweep(dir, 2);
  const std::string db = dir.file("r.db");
  { Database create(db); }
  SweepLock running(db);  // as a sweep in another process holds it
  const auto r = run_gradscope("sweep " + file + " --db " + db);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "another sweep is running on " + db)) << r.err;
  EXPECT_EQ(ok_runs(db), 0);
  // Looking at the plan needs no lock.
  EXPECT_EQ(run_gradscope("sweep " + file + " --db " + db + " --dry-run").code, 0);
}

TEST(HostileCli, ChildrenStartFromTheSweepsBinaryWhenItsFileIsReplaced) {
  testing::TempDir dir("gradscope-rebuild");
  const std::string binary = dir.file("gradscope");
  fs::copy_file(GRADSCOPE_BINARY, binary);
  const std::string file = two_run_sweep(dir, 40);
  const std::string db = dir.file("r.db");
  const std::string out = dir.file("out");
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string cmd =
        fmt::format("exec {} sweep {} --db {} --heartbeat 0 >{} 2>&1", binary, file, db, out);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Once the first run is under way, a "rebuild" replaces the file with one that fails.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!contains(slurp(out), "started, pid") && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  fs::remove(binary);
  std::ofstream(binary) << "#!/bin/sh\nexit 1\n";
  fs::permissions(binary, fs::perms::owner_all);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << slurp(out);
  EXPECT_EQ(ok_runs(db), 2) << slurp(out);
}

TEST(HostileCli, ReportReadsADatabaseThisUserCannotWrite) {
  testing::TempDir dir("gradscope-readonly");
  const std::string db = dir.file("r.db");
  auto run = run_gradscope(kHostileRun + " --steps 2 --db " + db);
  ASSERT_EQ(run.code, 0) << run.err;
  ASSERT_FALSE(fs::exists(db + "-shm"));  // the last connection cleaned up after itself
  // Root passes every permission check, so root reads it as nobody.
  std::string as_reader;
  if (geteuid() == 0) {
    as_reader = "setpriv --reuid=65534 --regid=65534 --clear-groups";
    if (std::system((as_reader + " test -x " + GRADSCOPE_BINARY + " 2>/dev/null").c_str()) != 0)
      GTEST_SKIP() << "user nobody cannot run " << GRADSCOPE_BINARY;
    fs::permissions(dir.path(), fs::perms::owner_all | fs::perms::group_read |
                                    fs::perms::group_exec | fs::perms::others_read |
                                    fs::perms::others_exec);
    fs::permissions(db, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                            fs::perms::others_read);
  } else {
    fs::permissions(dir.path(), fs::perms::owner_read | fs::perms::owner_exec);
  }
  const auto r = run_gradscope("report " + db + " --format md", as_reader);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "llama")) << r.out;
  EXPECT_FALSE(fs::exists(db + "-shm"));
}

// A database whose write-ahead log still holds committed transactions, in a folder this user
// cannot write (so no shared-memory file can be made): reading the file alone would miss
// them, so the report refuses with exit 2 and says how to complete the write.
TEST(HostileCli, ReportRefusesADatabaseWithAPendingWriteAheadLogItCannotRead) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to read the files as another user";
  if (std::system("setpriv --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no setpriv";
  const std::string as_reader = "setpriv --reuid=65534 --regid=65534 --clear-groups";
  if (std::system((as_reader + " test -x " + GRADSCOPE_BINARY + " 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "user nobody cannot run " << GRADSCOPE_BINARY;
  testing::TempDir dir("gradscope-pending-wal");
  const auto readable = fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                        fs::perms::others_read | fs::perms::others_exec;
  fs::permissions(dir.path(), readable);
  fs::create_directory(dir.file("shared"));
  fs::permissions(dir.file("shared"), readable);
  const std::string db = dir.file("r.db");
  auto run = run_gradscope(kHostileRun + " --steps 2 --db " + db);
  ASSERT_EQ(run.code, 0) << run.err;
  // A second attempt committed into the log and not yet checkpointed; the files are copied
  // while the connection holds them, as a copy of a live database would be.
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw,
                         "PRAGMA wal_autocheckpoint=0; INSERT INTO runs(run_id, status, "
                         "record_json) SELECT run_id, status, record_json FROM runs",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  fs::copy_file(db, dir.file("shared/r.db"));
  fs::copy_file(db + "-wal", dir.file("shared/r.db-wal"));
  sqlite3_close(raw);
  for (const char* name : {"shared/r.db", "shared/r.db-wal"})
    fs::permissions(dir.file(name), fs::perms::owner_read | fs::perms::owner_write |
                                        fs::perms::group_read | fs::perms::others_read);
  const auto r = run_gradscope("report " + dir.file("shared/r.db") + " --format md", as_reader);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "a write was left unfinished")) << r.err;
}

}  // namespace
}  // namespace gradscope
