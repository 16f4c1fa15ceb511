// `gradscope sweep --emit slurm` against Slurm itself: the one-node cluster that
// scripts/slurm-cluster.sh starts before this suite (a CTest fixture). Without it (Slurm not
// installed, not root) every test here skips, and CTest reports the suite skipped.
// SlurmEmit: what the emitted job holds, with no cluster.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gradscope/core/record.h"
#include "gradscope/store/db.h"
#include "gradscope/sweep/slurm.h"
#include "gradscope/train/train_state.h"
#include "test_util.h"

namespace gradscope {
namespace {

using testing::contains;
using testing::run_gradscope;
using testing::slurp;

// Whether the cluster the fixture started (SLURM_CONF) answers and has a node that takes jobs.
bool slurm_cluster_up() {
  const char* conf = std::getenv("SLURM_CONF");
  if (conf == nullptr || !std::filesystem::exists(conf)) return false;
  const CommandOutput r = run_command({"sinfo", "--noheader", "--format=%T"}, 20);
  return r.code == 0 &&
         (contains(r.output, "idle") || contains(r.output, "mix") || contains(r.output, "alloc"));
}

// Whether the cluster answers is decided once, before the suite's first test: without it every
// test skips and the line below is printed, which CTest's SKIP_REGULAR_EXPRESSION takes for
// "skipped". With it no test skips, so a failure is never reported as a skip.
class SlurmCluster : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    up_ = slurm_cluster_up();
    if (!up_)
      std::cout << "no Slurm cluster here: the SlurmCluster suite is skipped "
                   "(scripts/slurm-cluster.sh start DIR, then SLURM_CONF=DIR/slurm.conf)\n";
  }
  void SetUp() override {
    if (!up_) GTEST_SKIP() << "no Slurm cluster";
  }
  static bool up_;
};
bool SlurmCluster::up_ = false;

std::string slurm_sweep(const testing::TempDir& dir, const std::string& name,
                        const std::string& fixed, const std::string& axes) {
  const std::string path = dir.file(name + ".toml");
  std::ofstream(path) << "name = \"" << name << "\"\n[fixed]\nmodel = \"llama\"\n"
                      << "preset = \"tiny\"\nseq = 32\nbatch = 2\neval_batches = 1\n"
                      << "warmup_steps = 0\nthreads = 1\ndataset = \""
                      << testing::fixture("text/sotu-excerpt.txt") << "\"\n"
                      << fixed << "\n[axes]\n"
                      << axes << "\n";
  return path;
}

std::vector<std::string> submitted_jobs(const std::string& out) {
  std::vector<std::string> ids;
  std::ifstream in(out + "/jobs.txt");
  for (std::string id; std::getline(in, id);)
    if (!id.empty()) ids.push_back(id);
  return ids;
}

// Emits the sweep `file` into `out` and submits it; the ids of the jobs queued (none, with a
// failure, when the command failed).
std::vector<std::string> emit_and_submit(const std::string& file, const std::string& out) {
  const auto emit = run_gradscope("sweep " + file + " --emit slurm --out " + out + " --submit");
  EXPECT_EQ(emit.code, 0) << emit.out << emit.err;
  EXPECT_TRUE(contains(emit.out, "submitted job")) << emit.out;
  return emit.code == 0 ? submitted_jobs(out) : std::vector<std::string>{};
}

// Waits until none of `ids` is queued or running, up to `seconds`.
bool slurm_jobs_done(const std::vector<std::string>& ids, double seconds) {
  std::string list;
  for (const auto& id : ids) list += (list.empty() ? "" : ",") + id;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    const CommandOutput q =
        run_command({"squeue", "--noheader", "--array", "--jobs=" + list, "--format=%i"}, 20);
    if (q.code == 0 && q.output.find_first_not_of(" \n") == std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  return false;
}

std::map<std::string, std::vector<std::string>> slurm_statuses(const std::string& db_path) {
  Database db(db_path);
  std::map<std::string, std::vector<std::string>> out;
  for (const RunRecord& r : db.records()) out[r.run_id].push_back(status_name(r.status));
  return out;
}

// The result files of task `index` (task-I.jJOB.json, then task-I.jJOB.rK.json after
// requeues), by name.
std::vector<std::string> task_results(const std::string& out, int64_t index) {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(out + "/results"))
    if (is_task_result(e.path().filename().string(), index)) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<double> step_losses(const std::string& record_path) {
  const auto j = nlohmann::json::parse(slurp(record_path));
  std::vector<double> losses;
  for (const auto& s : j["steps"]) losses.push_back(s["loss"].get<double>());
  return losses;
}

TEST_F(SlurmCluster, AnArrayRunsEveryRunOnceAndCollectMergesOnce) {
  testing::TempDir dir("gradscope-slurm-array");
  const std::string file =
      slurm_sweep(dir, "array", "steps = 4", "optimizer = [\"sgd\", \"adam\", \"adagrad\"]");
  const std::string out = dir.file("job");
  const auto ids = emit_and_submit(file, out);
  ASSERT_EQ(ids.size(), 1u);
  ASSERT_TRUE(slurm_jobs_done(ids, 300)) << "the array did not finish in 5 minutes";

  const std::string db = dir.file("merged.db");
  auto c1 = run_gradscope("collect " + out + " --db " + db);
  ASSERT_EQ(c1.code, 0) << c1.out << c1.err << slurp(out + "/logs/task-0.log");
  EXPECT_TRUE(contains(c1.out, "merged 3 result files")) << c1.out;
  EXPECT_TRUE(contains(c1.out, "3 of 3 tasks have a final record")) << c1.out;
  const auto s = slurm_statuses(db);
  ASSERT_EQ(s.size(), 3u);
  for (const auto& [id, list] : s) EXPECT_EQ(list, std::vector<std::string>{"ok"}) << id;
  auto c2 = run_gradscope("collect " + out + " --db " + db);
  EXPECT_TRUE(contains(c2.out, "merged 0 result files")) << c2.out;
  EXPECT_TRUE(contains(c2.out, "3 already there")) << c2.out;
  EXPECT_EQ(slurm_statuses(db), s);
  // The runs are the grid's own: the same sweep run here has nothing left to do.
  auto dry = run_gradscope("sweep " + file + " --db " + db + " --dry-run");
  EXPECT_TRUE(contains(dry.out, "0 to run, 3 skipped")) << dry.out;
}

TEST_F(SlurmCluster, ARequeuedTaskResumesFromItsState) {
  testing::TempDir dir("gradscope-slurm-requeue");
  const std::string file = slurm_sweep(dir, "requeue", "steps = 1500", "optimizer = [\"adam\"]");
  const std::string out = dir.file("job");
  const auto ids = emit_and_submit(file, out);
  ASSERT_EQ(ids.size(), 1u);
  const std::string log = out + "/logs/task-0.log";
  // Requeued once it trains (Slurm sends SIGTERM: the run saves its state and stops).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!contains(slurp(log), "step 1/") && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_TRUE(contains(slurp(log), "step 1/")) << slurp(log);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const CommandOutput requeue = run_command({"scontrol", "requeue", ids[0] + "_0"}, 30);
  ASSERT_EQ(requeue.code, 0) << requeue.output;
  // Slurm holds a requeued job for two minutes before it may start again; let it go now.
  const auto eligible = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    const CommandOutput q =
        run_command({"squeue", "--noheader", "--jobs=" + ids[0], "--format=%T"}, 20);
    if (contains(q.output, "RUNNING") || q.output.find_first_not_of(" \n") == std::string::npos ||
        std::chrono::steady_clock::now() > eligible)
      break;
    if (contains(q.output, "PENDING"))
      run_command({"scontrol", "update", "jobid=" + ids[0], "StartTime=now"}, 30);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  ASSERT_TRUE(slurm_jobs_done(ids, 300)) << slurp(log);

  // The stopped attempt's record, then the requeued one's, which resumed where it stopped.
  const auto files = task_results(out, 0);
  ASSERT_EQ(files.size(), 2u) << slurp(log);
  EXPECT_TRUE(contains(files[1], ".r1.json")) << files[1];
  const auto first = nlohmann::json::parse(slurp(files[0]));
  ASSERT_EQ(first["status"], "interrupted") << slurp(log);
  const int64_t stopped_at = static_cast<int64_t>(first["steps"].size());
  EXPECT_GT(stopped_at, 0);
  EXPECT_LT(stopped_at, 1500);
  const auto second = nlohmann::json::parse(slurp(files[1]));
  EXPECT_EQ(second["status"], "ok") << slurp(log);
  EXPECT_EQ(second["resumed_from_steps"], nlohmann::json::array({stopped_at}));
  EXPECT_TRUE(contains(slurp(log), fmt::format("resuming from step {} of", stopped_at)))
      << slurp(log);
  std::cout << "requeued task resumed from step " << second["resumed_from_steps"][0] << "\n";
  EXPECT_FALSE(std::filesystem::exists(out + "/state/task-0"));

  const std::string db = dir.file("merged.db");
  auto c = run_gradscope("collect " + out + " --db " + db);
  ASSERT_EQ(c.code, 0) << c.out << c.err;
  EXPECT_TRUE(contains(c.out, "1 of 1 tasks have a final record")) << c.out;
  const auto s = slurm_statuses(db);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s.begin()->second, (std::vector<std::string>{"interrupted", "ok"}));
  auto dry = run_gradscope("sweep " + file + " --db " + db + " --dry-run");
  EXPECT_TRUE(contains(dry.out, "0 to run, 1 skipped")) << dry.out;
}

TEST_F(SlurmCluster, TwoRanksThroughSrunMatchTheLocalLauncher) {
  testing::TempDir dir("gradscope-slurm-ranks");
  const std::string file =
      slurm_sweep(dir, "ranks", "steps = 6\nnproc = 2\nshard = \"ddp\"", "optimizer = [\"adam\"]");
  const std::string out = dir.file("job");
  const auto ids = emit_and_submit(file, out);
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_TRUE(contains(slurp(out + "/sweep-n2.sbatch"), "#SBATCH --ntasks=2"));
  EXPECT_FALSE(std::filesystem::exists(out + "/sweep.sbatch"));
  ASSERT_TRUE(slurm_jobs_done(ids, 300));
  const auto files = task_results(out, 0);
  ASSERT_EQ(files.size(), 1u) << slurp(out + "/logs/task-0.log");
  const std::string slurm_record = files[0];
  const auto j = nlohmann::json::parse(slurp(slurm_record));
  EXPECT_EQ(j["status"], "ok");
  EXPECT_EQ(j["distributed"]["launcher"], "slurm");
  EXPECT_EQ(j["distributed"]["world"], 2);
  // A run that ended keeps no state: every rank cleared its part.
  EXPECT_FALSE(std::filesystem::exists(out + "/state/task-0"));

  // The same run from runs.json, its ranks started by gradscope itself.
  const RunsFile runs = read_runs_file(out);
  std::string args;
  for (const std::string& a : runs.runs[0].args) args += " '" + a + "'";
  const std::string local = dir.file("local.json");
  auto r = run_gradscope("run" + args + " --no-db --json " + local + " --quiet");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto a = step_losses(slurm_record), b = step_losses(local);
  ASSERT_EQ(a.size(), b.size());
  double most = 0;
  for (size_t i = 0; i < a.size(); ++i) most = std::max(most, std::abs(a[i] - b[i]));
  EXPECT_LE(most, 1e-6);
  std::cout << "srun ranks against --nproc 2: max |loss difference| " << most << " over "
            << a.size() << " steps\n";
}

TEST_F(SlurmCluster, AJobThatCannotStartIsReportedAndCancelled) {
  testing::TempDir dir("gradscope-slurm-never");
  const std::string file = slurm_sweep(dir, "never", "steps = 2", "optimizer = [\"sgd\"]");
  // A partition Slurm does not know: sbatch --test-only refuses it, nothing is queued.
  auto bad = run_gradscope("sweep " + file + " --emit slurm --out " + dir.file("a") +
                           " --submit --partition nosuch");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_TRUE(contains(bad.err, "Slurm refuses")) << bad.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("a/jobs.txt")));
  // Accepted but never startable: the test cluster's "short" partition takes a minute at
  // most. Reported with Slurm's reason and cancelled, not left pending.
  auto never = run_gradscope("sweep " + file + " --emit slurm --out " + dir.file("b") +
                             " --submit --partition short --time 10");
  EXPECT_EQ(never.code, 2) << never.out;
  EXPECT_TRUE(contains(never.err, "cannot start: Slurm says Partition")) << never.err;
  const auto ids = submitted_jobs(dir.file("b"));
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_TRUE(slurm_jobs_done(ids, 30));
  // More CPUs than any node has is refused before anything is written.
  auto greedy = run_gradscope("sweep " + file + " --emit slurm --out " + dir.file("c") +
                              " --cpus-per-task 4096");
  EXPECT_EQ(greedy.code, 2);
  EXPECT_TRUE(contains(greedy.err, "no node of")) << greedy.err;
  // So is a run of more ranks than the largest node has CPUs (its ranks share one node).
  const std::string wide =
      slurm_sweep(dir, "wide", "steps = 2\nnproc = 1024\nshard = \"ddp\"", "optimizer = [\"sgd\"]");
  auto ranks = run_gradscope("sweep " + wide + " --emit slurm --out " + dir.file("d"));
  EXPECT_EQ(ranks.code, 2) << ranks.out;
  EXPECT_TRUE(contains(ranks.err, "has 1024 ranks")) << ranks.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("d")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("c")));
}

// ---- no cluster needed ----

TEST(SlurmEmit, HostileTextIsRefusedOrInert) {
  testing::TempDir dir("gradscope-slurm-hostile");
  const std::string canary = dir.file("pwned");
  const std::vector<std::string> hostile = {"a b",
                                            "it's",
                                            "say \"hi\"",
                                            "$(touch " + canary + ")",
                                            "`touch " + canary + "`",
                                            "x;touch " + canary,
                                            "%a"};
  // A dataset is data: it goes into runs.json only, and the run is handed it as one argument.
  {
    const std::string path = dir.file("h.toml");
    std::ofstream(path) << "name = \"h\"\n[fixed]\nmodel = \"llama\"\npreset = \"tiny\"\n"
                        << "steps = 1\n[axes]\ndataset = " << nlohmann::json(hostile).dump()
                        << "\n";
    const std::string out = dir.file("job");
    auto emit = run_gradscope("sweep " + path + " --emit slurm --out " + out);
    ASSERT_EQ(emit.code, 0) << emit.err;
    const std::string script = slurp(out + "/sweep.sbatch");
    EXPECT_EQ(std::system(("bash -n " + out + "/sweep.sbatch").c_str()), 0);
    const RunsFile runs = read_runs_file(out);
    ASSERT_EQ(runs.runs.size(), hostile.size());
    for (size_t i = 0; i < hostile.size(); ++i) {
      if (hostile[i].size() > 2) EXPECT_FALSE(contains(script, hostile[i])) << script;
      const auto& args = runs.runs[i].args;
      EXPECT_EQ(std::count(args.begin(), args.end(), hostile[i]), 1) << hostile[i];
    }
    // The tasks of the three that a shell would run: each fails on the data set, as data.
    for (size_t i : {3, 4, 5}) {
      const std::string log = dir.file(fmt::format("task{}.log", i));
      const std::string task = fmt::format("SLURM_ARRAY_TASK_ID={} GRADSCOPE={} bash {} >{} 2>&1",
                                           i, GRADSCOPE_BINARY, out + "/sweep.sbatch", log);
      EXPECT_NE(std::system(task.c_str()), 0);
      EXPECT_TRUE(contains(slurp(log), "unknown text data set '" + hostile[i] + "'")) << slurp(log);
    }
  }
  // A line break in a value never gets that far: the sweep file is refused.
  {
    const std::string path = dir.file("nl.toml");
    std::ofstream(path) << "[fixed]\nmodel = \"llama\"\ndataset = \"a\\ntouch " << canary << "\"\n";
    auto emit = run_gradscope("sweep " + path + " --emit slurm --out " + dir.file("nl"));
    EXPECT_EQ(emit.code, 2);
    EXPECT_FALSE(std::filesystem::exists(dir.file("nl")));
  }
  // Names and folders go into #SBATCH lines and the script: refused unless plain.
  const std::string plain = dir.file("plain.toml");
  std::ofstream(plain) << "[fixed]\nmodel = \"llama\"\npreset = \"tiny\"\nsteps = 1\n";
  std::vector<std::string> bad = hostile;
  bad.push_back("a\nb");
  for (const std::string& text : bad) {
    std::string arg;  // the text as one shell word
    for (char c : text) arg += c == '\'' ? std::string("'\\''") : std::string(1, c);
    arg = "'" + arg + "'";
    auto out = run_gradscope("sweep " + plain + " --emit slurm --out " + dir.file("o") + "/" + arg);
    EXPECT_EQ(out.code, 2) << text;
    for (const std::string key : {"partition", "account", "time", "mem", "gpus_per_task"})
      testing::expect_usage_error([&] { check_slurm_setting(key, text); });
  }
  // Each flag and the name, once through the command line.
  for (const std::string flag :
       {"--partition", "--account", "--time", "--mem", "--gpus-per-task"}) {
    auto r = run_gradscope("sweep " + plain + " --emit slurm --out " + dir.file("f") + " " + flag +
                           " '$(touch " + canary + ")'");
    EXPECT_EQ(r.code, 2) << flag;
  }
  {
    const std::string named = dir.file("named.toml");
    std::ofstream(named) << "name = \"$(touch " << canary << ")\"\n[fixed]\nmodel = \"llama\"\n";
    auto r = run_gradscope("sweep " + named + " --emit slurm --out " + dir.file("n"));
    EXPECT_EQ(r.code, 2);
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("o")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("f")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("n")));
  EXPECT_FALSE(std::filesystem::exists(canary));
}

TEST(SlurmEmit, RanksMakeArraysOfTheirOwnAndTheFileSetsResources) {
  testing::TempDir dir("gradscope-slurm-arrays");
  const std::string path = dir.file("g.toml");
  std::ofstream(path) << "name = \"g\"\n[sweep]\nrun_timeout = 600\n"
                      << "[slurm]\npartition = \"gpu\"\naccount = \"proj-1\"\n"
                      << "time = \"01:30:00\"\nmem = \"8G\"\ncpus_per_task = 3\n"
                      << "[fixed]\nmodel = \"llama\"\npreset = \"tiny\"\nsteps = 1\n"
                      << "[axes]\noptimizer = [\"sgd\", \"adam\"]\nnproc = [1, 2]\n"
                      << "[[override]]\nwhen = { nproc = 2 }\nset = { shard = \"ddp\" }\n";
  const std::string out = dir.file("job");
  auto emit = run_gradscope("sweep " + path + " --emit slurm --out " + out + " --time 45");
  ASSERT_EQ(emit.code, 0) << emit.err;
  const std::string one = slurp(out + "/sweep.sbatch"), two = slurp(out + "/sweep-n2.sbatch");
  // Expansion order: optimizer, then nproc fastest: runs 0 and 2 have one rank.
  EXPECT_TRUE(contains(one, "#SBATCH --array=0,2\n")) << one;
  EXPECT_TRUE(contains(two, "#SBATCH --array=1,3\n#SBATCH --nodes=1\n#SBATCH --ntasks=2\n")) << two;
  EXPECT_TRUE(contains(two, "exec srun --ntasks=2 --cpus-per-task=3")) << two;
  for (const std::string& s : {one, two}) {
    EXPECT_TRUE(contains(s, "#SBATCH --partition=gpu\n")) << s;
    EXPECT_TRUE(contains(s, "#SBATCH --account=proj-1\n")) << s;
    EXPECT_TRUE(contains(s, "#SBATCH --time=45\n")) << s;  // the flag wins
    EXPECT_TRUE(contains(s, "#SBATCH --mem=8G\n")) << s;
    EXPECT_TRUE(contains(s, "#SBATCH --cpus-per-task=3\n")) << s;
    EXPECT_TRUE(contains(s, "#SBATCH --requeue\n")) << s;
  }
  const RunsFile runs = read_runs_file(out);
  ASSERT_EQ(runs.runs.size(), 4u);
  EXPECT_EQ(runs.runs[1].nproc, 2);
  // run_timeout reaches each run as --timeout, so a run past it records timeout itself.
  for (const TaskRun& run : runs.runs) {
    const auto& a = run.args;
    const auto at = std::find(a.begin(), a.end(), std::string("--timeout"));
    ASSERT_NE(at, a.end());
    EXPECT_EQ(*std::next(at), "600");
  }
  EXPECT_TRUE(is_task_result("task-3.json", 3));
  EXPECT_TRUE(is_task_result("task-3.r12.json", 3));
  EXPECT_TRUE(is_task_result("task-3.j4071.json", 3));
  EXPECT_TRUE(is_task_result("task-3.j4071.r2.json", 3));
  EXPECT_FALSE(is_task_result("task-3.r2.j4071.json", 3));
  EXPECT_FALSE(is_task_result("task-3.j.json", 3));
  EXPECT_FALSE(is_task_result("task-3.r.json", 3));
  EXPECT_FALSE(is_task_result("task-31.json", 3));
  EXPECT_FALSE(is_task_result("task-3.rx.json", 3));
  // The same grid may be emitted again (new resources); another grid may not, while this
  // folder's tasks could still read its runs.json.
  EXPECT_EQ(run_gradscope("sweep " + path + " --emit slurm --out " + out + " --time 50").code, 0);
  EXPECT_TRUE(contains(slurp(out + "/sweep.sbatch"), "#SBATCH --time=50\n"));
  const std::string other = dir.file("other.toml");
  std::ofstream(other) << "name = \"g\"\n[fixed]\nmodel = \"llama\"\npreset = \"tiny\"\n"
                       << "steps = 2\n";
  auto clash = run_gradscope("sweep " + other + " --emit slurm --out " + out);
  EXPECT_EQ(clash.code, 2);
  EXPECT_TRUE(contains(clash.err, "another grid")) << clash.err;
  EXPECT_EQ(read_runs_file(out).runs.size(), 4u);
  // An index runs.json does not have, and a damaged runs.json, are usage errors.
  auto r = run_gradscope("task " + out + " 4");
  EXPECT_EQ(r.code, 2) << r.err;
  std::ofstream(out + "/runs.json") << "{\"format\": \"gradscope-slurm-runs\", \"version\": 1}";
  r = run_gradscope("task " + out + " 0");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "runs.json")) << r.err;
  // A bad [slurm] value names its line.
  std::ofstream(path) << "[slurm]\ntime = \"1h; rm -rf /\"\n[fixed]\nmodel = \"llama\"\n";
  auto b = run_gradscope("sweep " + path + " --emit slurm --out " + dir.file("x"));
  EXPECT_EQ(b.code, 2);
  EXPECT_TRUE(contains(b.err, "g.toml:2")) << b.err;
}

TEST(SlurmEmit, ATaskResumesOnlyAStateEveryRankHas) {
  testing::TempDir dir("gradscope-slurm-state");
  const std::string path = dir.file("s.toml");
  std::ofstream(path) << "name = \"s\"\n[fixed]\nmodel = \"llama\"\npreset = \"tiny\"\n"
                      << "seq = 32\nbatch = 2\nsteps = 3\nwarmup_steps = 0\neval_batches = 1\n"
                      << "threads = 1\nsample_period = 0\nnproc = 2\nshard = \"ddp\"\n"
                      << "dataset = \"" << testing::fixture("text/sotu-excerpt.txt") << "\"\n";
  const std::string out = dir.file("job");
  ASSERT_EQ(run_gradscope("sweep " + path + " --emit slurm --out " + out).code, 0);
  const RunsFile runs = read_runs_file(out);
  ASSERT_EQ(runs.runs.size(), 1u);
  // A state of run 0 as a stopped attempt leaves it: each rank's part in state/task-0/rank-R.
  const std::string state = out + "/state/task-0";
  std::string args;
  for (const std::string& a : runs.runs[0].args) args += " '" + a + "'";
  auto r = run_gradscope("run" + args + " --save-state " + state +
                         " --state-every 1 --no-db --json " + dir.file("r.json") + " --quiet");
  ASSERT_EQ(r.code, 0) << r.err;
  std::string why;
  EXPECT_FALSE(resumable_state(state, 2, "another-run", &why));
  EXPECT_TRUE(contains(why, "not another-run")) << why;
  // Run by hand (no SLURM_PROCID): the task resumes, and every part is its own.
  TaskLaunch launch = plan_task(out, 0);
  EXPECT_TRUE(launch.resume) << launch.why;
  EXPECT_EQ(launch.own_state, state);
  EXPECT_EQ(launch.args[launch.args.size() - 2], "--resume");
  // Rank 1's part gone: no rank resumes, and the rest is cleared for a fresh start.
  std::filesystem::remove_all(state + "/rank-1");
  launch = plan_task(out, 0);
  EXPECT_FALSE(launch.resume);
  EXPECT_EQ(launch.why, "rank 1 has no state");
  EXPECT_FALSE(std::filesystem::exists(state + "/rank-0"));
  EXPECT_EQ(std::count(launch.args.begin(), launch.args.end(), std::string("--resume")), 0);
}

}  // namespace
}  // namespace gradscope
