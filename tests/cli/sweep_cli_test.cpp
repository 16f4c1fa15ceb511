// Sweeps as a user runs them: child processes, resume after kill -9 of the sweep or of a
// child, timeouts, memory limits, Slurm emission and collect. Runs the real binary on the
// tiny Llama and the committed text excerpt.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <regex>
#include <thread>

#include <fmt/format.h>

#include "gradscope/core/record.h"
#include "gradscope/store/db.h"
#include "test_util.h"

namespace gradscope {
namespace {

using testing::contains;
using testing::run_gradscope;
using testing::slurp;

// A sweep file of `models` x 2 optimizers of the tiny Llama on the excerpt.
std::string write_sweep(const testing::TempDir& dir, int64_t steps,
                        const std::string& extra_sweep = "",
                        const std::vector<std::string>& seeds = {"0"}) {
  std::string seed_list;
  for (const auto& s : seeds) seed_list += (seed_list.empty() ? "" : ", ") + s;
  const std::string path = dir.file("grid.toml");
  std::ofstream f(path);
  f << "name = \"t\"\n[sweep]\n"
    << extra_sweep << "\n"
    << "[fixed]\nmodel = \"llama\"\npreset = \"tiny\"\nseq = 32\nbatch = 2\neval_batches = 1\n"
    << "warmup_steps = 0\nsteps = " << steps << "\ndataset = \""
    << testing::fixture("text/sotu-excerpt.txt")
    << "\"\n[axes]\noptimizer = [\"sgd\", \"adam\"]\nseed = [" << seed_list << "]\n";
  return path;
}

// ok attempts per run id, and all statuses per run id.
std::map<std::string, std::vector<std::string>> statuses(const std::string& db_path) {
  Database db(db_path);
  std::map<std::string, std::vector<std::string>> out;
  for (const RunRecord& r : db.records()) out[r.run_id].push_back(status_name(r.status));
  return out;
}

int64_t count_ok(const std::vector<std::string>& s) {
  return std::count(s.begin(), s.end(), std::string("ok"));
}

// Waits until `done` holds (polling), up to `seconds`.
bool wait_for(const std::function<bool()>& done, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

int wait_exit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::vector<pid_t> child_pids(const std::string& output) {
  std::vector<pid_t> pids;
  static const std::regex started("started, pid ([0-9]+)");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), started);
       it != std::sregex_iterator(); ++it)
    pids.push_back(std::stoi((*it)[1]));
  return pids;
}

TEST(SweepCli, RunsEveryConfigThenResumeSkipsThem) {
  testing::TempDir dir("gradscope-sweep");
  const std::string file = write_sweep(dir, 2);
  const std::string db = dir.file("r.db");
  auto dry = run_gradscope("sweep " + file + " --db " + db + " --dry-run");
  ASSERT_EQ(dry.code, 0) << dry.err;
  EXPECT_TRUE(contains(dry.out, "2 to run, 0 skipped")) << dry.out;

  auto first = run_gradscope("sweep " + file + " --db " + db);
  ASSERT_EQ(first.code, 0) << first.out << first.err;
  auto s = statuses(db);
  ASSERT_EQ(s.size(), 2u);
  for (const auto& [id, list] : s) EXPECT_EQ(list, std::vector<std::string>{"ok"}) << id;
  EXPECT_TRUE(contains(first.out, "sgd seed=0: ok")) << first.out;

  auto again = run_gradscope("sweep " + file + " --db " + db);
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_TRUE(contains(again.out, "0 to run, 2 done")) << again.out;
  EXPECT_EQ(statuses(db), s);  // nothing ran twice
  dry = run_gradscope("sweep " + file + " --db " + db + " --dry-run");
  EXPECT_TRUE(contains(dry.out, "0 to run, 2 skipped")) << dry.out;
}

// One run of a grid, by its id: what is rerun to check a committed result.
TEST(SweepCli, OnlyRunsTheRunsNamedByTheirIds) {
  testing::TempDir dir("gradscope-sweep-only");
  const std::string file = write_sweep(dir, 2);
  const std::string db = dir.file("r.db");
  auto dry = run_gradscope("sweep " + file + " --db " + db + " --dry-run");
  ASSERT_EQ(dry.code, 0) << dry.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(dry.out, m, std::regex("adam seed=0 +([0-9a-f]{16})"))) << dry.out;
  const std::string adam = m[1];
  dry = run_gradscope("sweep " + file + " --db " + db + " --dry-run --only " + adam);
  ASSERT_EQ(dry.code, 0) << dry.err;
  EXPECT_TRUE(contains(dry.out, "1 to run, 0 skipped")) << dry.out;
  EXPECT_FALSE(contains(dry.out, "sgd")) << dry.out;

  auto one = run_gradscope("sweep " + file + " --db " + db + " --only " + adam);
  ASSERT_EQ(one.code, 0) << one.out << one.err;
  const auto s = statuses(db);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s.begin()->first, adam);

  auto unknown = run_gradscope("sweep " + file + " --db " + db + " --only 0123456789abcdef");
  EXPECT_EQ(unknown.code, 2);
  EXPECT_TRUE(contains(unknown.err, "--only 0123456789abcdef: no run of")) << unknown.err;
}

// The sweep plans each run under the id gradscope 0.1.0 (commit 048378a) gave it, so that a
// sweep resumed on a database of that version skips what it ran.
TEST(SweepCli, DryRunListsTheRunIdsOfVersionZeroOne) {
  testing::TempDir dir("gradscope-sweep-ids");
  const std::string path = dir.file("ids.toml");
  std::ofstream(path) << "[fixed]\nmodel = \"llama\"\n"
                      << "[axes]\nstrategy = [\"standard\", \"checkpoint\", \"accumulation\", "
                         "\"fused\"]\n"
                      << "[[override]]\nwhen = { strategy = \"accumulation\" }\n"
                      << "set = { accum_steps = 4 }\n";
  auto r = run_gradscope("sweep " + path + " --db " + dir.file("r.db") + " --dry-run");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* id :
       {"dc61552a07d43c5d", "84d47e0a65bdd4b6", "1d4e320eb6218798", "12e650da681bcb38"})
    EXPECT_TRUE(contains(r.out, id)) << id << " in:\n" << r.out;
}

TEST(SweepCli, JobsRunChildrenSideBySideWithThreadsSplit) {
  testing::TempDir dir("gradscope-sweep-jobs");
  const std::string file = write_sweep(dir, 2, "jobs = 2\n", {"0", "1"});  // 4 runs
  const std::string db = dir.file("r.db");
  auto r = run_gradscope("sweep " + file + " --db " + db + " --threads-note");
  EXPECT_EQ(r.code, 2);  // an unknown flag is refused before anything runs
  EXPECT_FALSE(std::filesystem::exists(db));
  r = run_gradscope("sweep " + file + " --db " + db);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  const int64_t threads = std::max<int64_t>(1, cores / 2);
  EXPECT_TRUE(contains(r.out, fmt::format("2 at a time, {} thread", threads))) << r.out;
  const auto s = statuses(db);
  ASSERT_EQ(s.size(), 4u);
  for (const auto& [id, list] : s) EXPECT_EQ(list, std::vector<std::string>{"ok"}) << id;
  // Each child was told its share of the threads.
  Database d(db);
  for (const RunRecord& rec : d.records()) EXPECT_EQ(rec.config.threads, threads);
}

TEST(SweepCli, KillNineOfTheSweepThenResumeLosesAndDuplicatesNothing) {
  testing::TempDir dir("gradscope-sweep-kill");
  const std::string file = write_sweep(dir, 40, "", {"0", "1", "2"});  // 6 runs
  const std::string db = dir.file("r.db");
  const pid_t sweep = testing::start_gradscope("sweep " + file + " --db " + db, dir.file("out"));
  // Kill it once two runs are stored and a third is under way.
  ASSERT_TRUE(wait_for(
      [&] {
        if (!std::filesystem::exists(db)) return false;
        int64_t n = 0;
        for (const auto& [id, list] : statuses(db)) n += static_cast<int64_t>(list.size());
        return n >= 2 && child_pids(slurp(dir.file("out"))).size() >= 3;
      },
      120));
  kill(sweep, SIGKILL);
  wait_exit(sweep);
  // Its children stop with it (SIGTERM): none can store a finished run that the resume will
  // start again.
  const auto children = child_pids(slurp(dir.file("out")));
  EXPECT_TRUE(wait_for([&] { return kill(children.back(), 0) != 0; }, 10))
      << "child " << children.back() << " outlived the sweep";

  auto resumed = run_gradscope("sweep " + file + " --db " + db);
  ASSERT_EQ(resumed.code, 0) << resumed.out << resumed.err;
  const auto s = statuses(db);
  ASSERT_EQ(s.size(), 6u);
  for (const auto& [id, list] : s) {
    EXPECT_EQ(count_ok(list), 1) << id;
    // Besides it, at most the attempt that ran when the sweep died: stopped, it recorded itself
    // interrupted (or left nothing, stopped before its training began), and the resume went on.
    EXPECT_LE(list.size(), 2u) << id;
    if (list.size() == 2) EXPECT_EQ(list.front(), "interrupted") << id;
  }
}

TEST(SweepCli, KillNineOfAChildIsCrashedThenRetried) {
  testing::TempDir dir("gradscope-sweep-child");
  const std::string file = write_sweep(dir, 400);
  const std::string db = dir.file("r.db");
  const pid_t sweep = testing::start_gradscope("sweep " + file + " --db " + db, dir.file("out"));
  ASSERT_TRUE(wait_for([&] { return !child_pids(slurp(dir.file("out"))).empty(); }, 60));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(child_pids(slurp(dir.file("out")))[0], SIGKILL);
  EXPECT_EQ(wait_exit(sweep), 0) << slurp(dir.file("out"));
  const auto s = statuses(db);
  ASSERT_EQ(s.size(), 2u);
  int crashed = 0;
  for (const auto& [id, list] : s) {
    EXPECT_EQ(count_ok(list), 1) << id;
    crashed += static_cast<int>(std::count(list.begin(), list.end(), std::string("crashed")));
  }
  EXPECT_EQ(crashed, 1) << slurp(dir.file("out"));
  EXPECT_TRUE(contains(slurp(dir.file("out")), "killed by signal 9")) << slurp(dir.file("out"));
}

TEST(SweepCli, HangingRunsAreTimeoutAndTheSweepGoesOn) {
  testing::TempDir dir("gradscope-sweep-timeout");
  // sgd runs forever (a million steps); adam is short. run_timeout stops sgd, twice.
  const std::string path = dir.file("grid.toml");
  std::ofstream(path)
      << "name = \"t\"\n[sweep]\nrun_timeout = 3\n"
      << "[fixed]\nmodel = \"llama\"\npreset = \"tiny\"\nseq = 32\nbatch = 2\n"
      << "eval_batches = 1\nsteps = 2\ndataset = \"" << testing::fixture("text/sotu-excerpt.txt")
      << "\"\n"
      << "[axes]\noptimizer = [\"sgd\", \"adam\"]\n"
      << "[[override]]\nwhen = { optimizer = \"sgd\" }\nset = { steps = 1000000 }\n";
  const std::string db = dir.file("r.db");
  auto r = run_gradscope("sweep " + path + " --db " + db + " --heartbeat 0");
  EXPECT_EQ(r.code, 1) << r.out << r.err;  // one run never finished
  const auto s = statuses(db);
  ASSERT_EQ(s.size(), 2u);
  std::vector<std::string> timeouts = {"timeout", "timeout"}, oks = {"ok"};
  int matched = 0;
  for (const auto& [id, list] : s) matched += (list == timeouts) + 2 * (list == oks);
  EXPECT_EQ(matched, 3) << r.out;
  // A third invocation does not try again: two failed attempts are enough.
  auto again = run_gradscope("sweep " + path + " --db " + db + " --dry-run");
  EXPECT_TRUE(contains(again.out, "given up")) << again.out;
}

TEST(SweepCli, MemoryLimitGivesOomAndTheSweepGoesOn) {
  testing::TempDir dir("gradscope-sweep-oom");
  // A tiny Llama of batch 2 runs in well under 1200 MiB of address space; a batch of 2048
  // sequences of 64 needs more (with fused attention a batch of 512 still fits: its tensors
  // peak at 524 MB). The limit sits between.
  const std::string path = dir.file("grid.toml");
  std::ofstream(path) << "name = \"t\"\n[sweep]\nmemory_limit = \"1200MiB\"\n"
                      << "[fixed]\nmodel = \"llama\"\npreset = \"tiny\"\nseq = 64\nsteps = 2\n"
                      << "eval_batches = 1\nthreads = 1\ndataset = \""
                      << testing::fixture("text/sotu-excerpt.txt") << "\"\n"
                      << "[axes]\nbatch = [2, 2048]\n";
  const std::string db = dir.file("r.db");
  auto r = run_gradscope("sweep " + path + " --db " + db + " --heartbeat 0");
  EXPECT_EQ(r.code, 0) << r.out << r.err;  // oom is a final outcome
  std::vector<std::string> all;
  for (const auto& [id, list] : statuses(db)) all.insert(all.end(), list.begin(), list.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<std::string>{"ok", "oom"})) << r.out;
}

TEST(SweepCli, SlurmScriptRunsLocallyAndCollectMergesOnce) {
  testing::TempDir dir("gradscope-slurm");
  const std::string file = write_sweep(dir, 2);
  const std::string out = dir.file("cluster");
  auto emit = run_gradscope("sweep " + file + " --emit slurm --out " + out);
  ASSERT_EQ(emit.code, 0) << emit.err;
  const std::string script = out + "/sweep.sbatch";
  EXPECT_EQ(std::system(("bash -n " + script).c_str()), 0);
  const std::string text = slurp(script);
  EXPECT_TRUE(contains(text, "#SBATCH --array=0-1")) << text;
  // Task 1 as Slurm would run it.
  const std::string task = std::string("SLURM_ARRAY_TASK_ID=1 GRADSCOPE=") + GRADSCOPE_BINARY +
                           " bash " + script + " >" + dir.file("task.log") + " 2>&1";
  ASSERT_EQ(std::system(task.c_str()), 0) << slurp(dir.file("task.log"));
  ASSERT_TRUE(std::filesystem::exists(out + "/results/task-1.json"));

  const std::string db = dir.file("merged.db");
  auto c1 = run_gradscope("collect " + out + " --db " + db);
  ASSERT_EQ(c1.code, 0) << c1.err;
  EXPECT_TRUE(contains(c1.out, "merged 1 result file")) << c1.out;
  EXPECT_TRUE(contains(c1.out, "1 of 2 tasks have a final record")) << c1.out;
  auto c2 = run_gradscope("collect " + out + " --db " + db);
  EXPECT_TRUE(contains(c2.out, "merged 0 result files")) << c2.out;
  const auto s = statuses(db);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s.begin()->second, std::vector<std::string>{"ok"});
  // The merged run is the one a local sweep would have run: resuming locally skips it.
  auto dry = run_gradscope("sweep " + file + " --db " + db + " --dry-run");
  EXPECT_TRUE(contains(dry.out, "1 to run, 1 skipped")) << dry.out;
}

TEST(SweepCli, RunConfigFileWithFlagsOverridingIt) {
  testing::TempDir dir("gradscope-runconfig");
  const std::string path = dir.file("run.toml");
  std::ofstream(path) << "model = \"llama\"\npreset = \"tiny\"\nseq = 32\nbatch = 2\nsteps = 3\n"
                      << "eval_batches = 1\noptimizer = \"sgd\"\ndataset = \""
                      << testing::fixture("text/sotu-excerpt.txt") << "\"\n[opt]\nmomentum = 0.9\n";
  auto r = run_gradscope("run --config " + path + " --steps 2 --quiet --db " + dir.file("r.db") +
                         " --json " + dir.file("r.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto record = nlohmann::json::parse(slurp(dir.file("r.json")));
  EXPECT_EQ(record["config"]["steps"], 2);  // the flag wins
  EXPECT_EQ(record["config"]["optimizer"], "sgd");
  EXPECT_EQ(record["config"]["opt"]["momentum"], "0.9");
  EXPECT_TRUE(record["attempt_uid"].is_string());
}

TEST(SweepCli, BadSweepFilesAreUsageErrors) {
  testing::TempDir dir("gradscope-badsweep");
  const std::string path = dir.file("bad.toml");
  std::ofstream(path) << "[axes]\nmodel = [\"llama\",\n";
  auto r = run_gradscope("sweep " + path + " --db " + dir.file("r.db"));
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "bad.toml:")) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("r.db")));
  std::ofstream(path) << "[axes]\nmodel = [\"nosuch\"]\n";
  r = run_gradscope("sweep " + path + " --db " + dir.file("r.db") + " --dry-run");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.err, "run 1 of 1")) << r.err;
}

}  // namespace
}  // namespace gradscope
