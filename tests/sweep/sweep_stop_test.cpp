// SIGTERM to a sweep: its running child saves its training state and is recorded interrupted,
// the sweep exits 75, and the next `gradscope sweep` resumes that run from its state instead
// of starting it again. Runs the real binary on the tiny Llama and the committed excerpt.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include <fmt/format.h>

#include "gradscope/cli/commands.h"
#include "gradscope/core/record.h"
#include "gradscope/store/db.h"
#include "gradscope/sweep/grid.h"
#include "gradscope/sweep/runner.h"
#include "test_util.h"

namespace gradscope {
namespace {

namespace fs = std::filesystem;

bool wait_until(const std::function<bool()>& done, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return done();
}

// Whether a log in `dir` shows a finished step: the child is in its training loop.
bool a_log_shows_a_step(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().extension() == ".log" &&
        testing::contains(testing::slurp(entry.path().string()), "step 1/"))
      return true;
  return false;
}

// Long enough that the stop, sent once the first step is logged, always lands mid-run.
constexpr int64_t kStopSteps = 200;

TEST(SweepResume, ASweepStoppedBySigtermResumesItsRunNextTime) {
  testing::TempDir dir("gradscope-sweep-stop");
  const std::string file = dir.file("grid.toml");
  std::ofstream(file)
      << "name = \"stop\"\n[sweep]\njobs = 1\n[fixed]\nmodel = \"llama\"\npreset = \"tiny\"\n"
      << "seq = 16\nbatch = 1\neval_batches = 1\nwarmup_steps = 0\nsteps = " << kStopSteps << "\n"
      << "dataset = \"" << testing::fixture("text/sotu-excerpt.txt") << "\"\n"
      << "[axes]\noptimizer = [\"adam\", \"sgd\"]\n";
  const std::string db = dir.file("r.db");
  const std::string logs = db + ".logs";

  const pid_t sweep =
      testing::start_gradscope(fmt::format("sweep {} --db {}", file, db), dir.file("out"));
  ASSERT_TRUE(wait_until([&] { return a_log_shows_a_step(logs); }, 120))
      << testing::slurp(dir.file("out"));
  // As systemd or Slurm do: SIGTERM to every process, and the sweep forwards one more.
  const std::string started = testing::slurp(dir.file("out"));
  const auto pid_at = started.find("pid ");
  ASSERT_NE(pid_at, std::string::npos) << started;
  const pid_t child = static_cast<pid_t>(std::stol(started.substr(pid_at + 4)));
  kill(child, SIGTERM);
  kill(sweep, SIGTERM);
  int status = 0;
  waitpid(sweep, &status, 0);
  const std::string out = testing::slurp(dir.file("out"));
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 75) << out;
  EXPECT_TRUE(testing::contains(out, "interrupted")) << out;
  // The running run and the one the stop kept from starting are both left for next time.
  EXPECT_TRUE(testing::contains(out, "2 runs left by the stop")) << out;

  std::string run_id;
  {
    Database d(db);
    const auto records = d.records();
    ASSERT_EQ(records.size(), 1u) << out;
    EXPECT_EQ(records[0].status, RunStatus::kInterrupted) << out;
    run_id = records[0].run_id;
  }
  const std::string state = run_state_folder(logs, run_id);
  ASSERT_TRUE(fs::exists(fs::path(state) / "state.json")) << out;

  const auto dry = testing::run_gradscope("sweep " + file + " --db " + db + " --dry-run");
  EXPECT_TRUE(testing::contains(dry.out, "resume")) << dry.out;

  const auto again = testing::run_gradscope("sweep " + file + " --db " + db + " --only " + run_id);
  ASSERT_EQ(again.code, 0) << again.out << again.err;
  EXPECT_TRUE(testing::contains(again.out, "resumed")) << again.out;
  Database d(db);
  EXPECT_EQ(d.statuses_of(run_id),
            (std::vector<RunStatus>{RunStatus::kInterrupted, RunStatus::kOk}));
  const std::optional<RunRecord> last = d.latest_record(run_id);
  ASSERT_TRUE(last);
  ASSERT_EQ(last->resumed_from_steps.size(), 1u);
  EXPECT_GE(last->resumed_from_steps[0], 1);
  EXPECT_EQ(last->steps.size(), static_cast<size_t>(kStopSteps));
  EXPECT_FALSE(fs::exists(state));  // removed once the run is stored ok
}

// What a sweep plans for a run with interrupted attempts: resume it when its state is kept,
// else start it again; an interrupted attempt never counts as a failed one.
TEST(SweepPlanInterrupted, ResumesWithAStateAndNeverGivesUpForInterruptions) {
  testing::TempDir dir("gradscope-plan-interrupted");
  const std::string file = dir.file("grid.toml");
  std::ofstream(file) << "name = \"plan\"\n[fixed]\nmodel = \"llama\"\npreset = \"tiny\"\n"
                      << "seq = 32\nsteps = 2\ndataset = \""
                      << testing::fixture("text/sotu-excerpt.txt") << "\"\n"
                      << "[axes]\nseed = [0, 1, 2]\n";
  const Sweep sweep = load_sweep(file);
  Database db(dir.file("p.db"));
  const std::string logs = dir.file("p.db.logs");
  std::vector<PlannedRun> plan = plan_sweep(sweep, db, parse_run_arguments, logs);
  ASSERT_EQ(plan.size(), 3u);
  const auto record = [&](const PlannedRun& run, RunStatus status) {
    db.write_run(failure_record(run, sweep.name, status, "stopped", dir.file("log"),
                                "2026-01-01T00:00:00Z", 1.0, 1));
  };
  // Seed 0: three interruptions, no state: started again, never given up.
  for (int i = 0; i < 3; ++i) record(plan[0], RunStatus::kInterrupted);
  // Seed 1: crashed, then interrupted with its state kept: resumed.
  record(plan[1], RunStatus::kCrashed);
  record(plan[1], RunStatus::kInterrupted);
  const std::string state = run_state_folder(logs, plan[1].run_id);
  fs::create_directories(state);
  std::ofstream(fs::path(state) / "state.json") << "{}\n";
  // Seed 2: its child saved a state (left aside by a save) and died before it recorded
  // itself: resumed, whatever the last stored status.
  record(plan[2], RunStatus::kCrashed);
  const std::string aside =
      (fs::path(logs) / ("." + plan[2].run_id + ".state.old-abcdef")).string();
  fs::create_directories(aside);
  std::ofstream(fs::path(aside) / "state.json") << "{}\n";
  plan = plan_sweep(sweep, db, parse_run_arguments, logs);
  EXPECT_EQ(plan[0].action, "run");
  EXPECT_EQ(plan[1].action, "resume");
  EXPECT_EQ(plan[2].action, "resume");
  EXPECT_TRUE(plan[1].pending());
  // Another failure after it: a retry from step 0 would be the second failed attempt.
  record(plan[1], RunStatus::kError);
  plan = plan_sweep(sweep, db, parse_run_arguments, logs);
  EXPECT_EQ(plan[1].action, "given up");
  EXPECT_FALSE(is_final_status(RunStatus::kInterrupted));
}

}  // namespace
}  // namespace gradscope
