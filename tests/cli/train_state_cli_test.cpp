// The training state across processes: `gradscope run` killed with SIGKILL after its state for
// some step appeared, or stopped with SIGTERM (exit 75, status interrupted), and resumed with
// --resume, gives the losses and final weights of the run trained in one go, bit for bit.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "gradscope/core/json_input.h"
#include "gradscope/core/record.h"
#include "gradscope/store/db.h"
#include "gradscope/train/train_state.h"
#include "test_util.h"

namespace gradscope {
namespace train_state_cli {
namespace {

constexpr int64_t kSteps = 20;  // warm-up included; long enough to be stopped midway

// The tiny Llama on the committed excerpt, with dropout and a schedule: one thread, so that
// two processes compute alike.
std::string run_args(const std::string& extra) {
  return fmt::format(
      "run --model llama --preset tiny --seq 32 --batch 2 --steps {} --warmup-steps 1 "
      "--dropout 0.1 --lr-warmup-steps 3 --eval-every 7 --eval-batches 1 --threads 1 "
      "--optimizer adam --lr 0.003 --dataset {} --quiet {}",
      kSteps - 1, testing::fixture("text/sotu-excerpt.txt"), extra);
}

int exit_code_of(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The step of the state in `dir`, -1 while there is none.
int64_t state_step(const std::string& dir) {
  try {
    return read_train_state_info(dir).step;
  } catch (const std::exception&) {
    return -1;
  }
}

bool poll(const std::function<bool()>& done, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return done();
}

RunRecord record_file(const std::string& path) {
  return record_from_json(parse_json_input(testing::slurp(path), path));
}

void expect_same_run(const RunRecord& resumed, const RunRecord& whole, const std::string& a,
                     const std::string& b) {
  ASSERT_EQ(resumed.steps.size(), whole.steps.size());
  for (size_t i = 0; i < whole.steps.size(); ++i) {
    ASSERT_TRUE(resumed.steps[i].loss && whole.steps[i].loss);
    EXPECT_EQ(*resumed.steps[i].loss, *whole.steps[i].loss) << "step " << i + 1;
  }
  ASSERT_EQ(resumed.evals.size(), whole.evals.size());
  for (size_t i = 0; i < whole.evals.size(); ++i)
    EXPECT_EQ(resumed.evals[i].val_loss, whole.evals[i].val_loss);
  // The final weights, as each run's last state holds them.
  const auto wa = read_state_weights(a), wb = read_state_weights(b);
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i) {
    EXPECT_EQ(wa[i].first, wb[i].first);
    EXPECT_TRUE(torch::equal(wa[i].second, wb[i].second)) << wa[i].first;
  }
}

TEST(TrainStateCli, KilledOrStoppedRunsResumeBitwise) {
  testing::TempDir dir("gradscope-state-cli");
  const auto file = [&](const std::string& name) { return dir.file(name); };
  // In one go, its final state saved (every kSteps steps: at the end alone).
  const auto whole = testing::run_gradscope(
      run_args(fmt::format("--db {} --json {} --save-state {} "
                           "--state-every {}",
                           file("whole.db"), file("whole.json"), file("whole-state"), kSteps)));
  ASSERT_EQ(whole.code, 0) << whole.err;
  const RunRecord reference = record_file(file("whole.json"));
  ASSERT_EQ(state_step(file("whole-state")), kSteps);

  // SIGKILL once the state of step 3 or later is there: nothing of the process is left but
  // that state.
  const std::string killed_args = run_args(fmt::format("--db {} --save-state {} --state-every 1",
                                                       file("killed.db"), file("killed-state")));
  const pid_t killed =
      testing::start_gradscope(killed_args + " --json " + file("killed-1.json"), file("k.out"));
  ASSERT_TRUE(poll([&] { return state_step(file("killed-state")) >= 3; }, 120));
  kill(killed, SIGKILL);
  ASSERT_EQ(exit_code_of(killed), 128 + SIGKILL) << "the run ended before it was killed";
  const int64_t k = state_step(file("killed-state"));
  ASSERT_GE(k, 3);
  ASSERT_LT(k, kSteps);
  const auto resumed = testing::run_gradscope(killed_args + " --json " + file("killed-2.json") +
                                              " --resume " + file("killed-state"));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  const RunRecord after_kill = record_file(file("killed-2.json"));
  EXPECT_EQ(after_kill.status, RunStatus::kStatusOk);
  EXPECT_EQ(after_kill.resumed_from_steps, std::vector<int64_t>{k});
  expect_same_run(after_kill, reference, file("killed-state"), file("whole-state"));

  // SIGTERM: the run saves its state, records itself interrupted and exits 75.
  const std::string stopped_args =
      run_args(fmt::format("--db {} --save-state {}", file("stopped.db"), file("stopped-state")));
  const pid_t stopped = testing::start_gradscope(
      stopped_args + " --state-every 2 --json " + file("stopped-1.json"), file("t.out"));
  ASSERT_TRUE(poll([&] { return state_step(file("stopped-state")) >= 2; }, 120));
  // Twice, as when a scheduler and a sweep each send one: the second must not end the save.
  kill(stopped, SIGTERM);
  kill(stopped, SIGTERM);
  ASSERT_EQ(exit_code_of(stopped), 75) << testing::slurp(file("t.out"));
  const RunRecord interrupted = record_file(file("stopped-1.json"));
  EXPECT_EQ(interrupted.status, RunStatus::kStatusInterrupted);
  ASSERT_TRUE(interrupted.failure && interrupted.failure->step);
  const int64_t at = *interrupted.failure->step;
  EXPECT_EQ(state_step(file("stopped-state")), at);  // saved where it stopped
  EXPECT_EQ(interrupted.steps.size(), static_cast<size_t>(at));
  EXPECT_TRUE(testing::contains(interrupted.failure->message, "SIGTERM"))
      << interrupted.failure->message;
  // Resumed with --state-every kSteps: its last state is at the end, as the whole run's.
  const auto finished = testing::run_gradscope(
      stopped_args + fmt::format(" --state-every {} --json {} --resume {}", kSteps,
                                 file("stopped-2.json"), file("stopped-state")));
  ASSERT_EQ(finished.code, 0) << finished.err;
  const RunRecord after_stop = record_file(file("stopped-2.json"));
  EXPECT_EQ(after_stop.resumed_from_steps, std::vector<int64_t>{at});
  expect_same_run(after_stop, reference, file("stopped-state"), file("whole-state"));
  // Both attempts are in the database, the interrupted one first; only the second is ok.
  Database db(file("stopped.db"));
  EXPECT_EQ(db.statuses_of(reference.run_id),
            (std::vector<RunStatus>{RunStatus::kStatusInterrupted, RunStatus::kStatusOk}));

  // A resume with another setting is refused before anything is written.
  const auto other = testing::run_gradscope(run_args(
      "--no-db --json " + file("other.json") + " --seed 7 --resume " + file("stopped-state")));
  EXPECT_EQ(other.code, 2);
  EXPECT_TRUE(testing::contains(other.err, "--seed")) << other.err;
  EXPECT_FALSE(std::filesystem::exists(file("other.json")));
}

TEST(TrainStateCli, HelpNamesTheStoppedExitCode) {
  const auto help = testing::run_gradscope("run --help");
  EXPECT_TRUE(testing::contains(help.out, "75 when SIGTERM or SIGINT")) << help.out;
  EXPECT_TRUE(testing::contains(help.out, "--save-state")) << help.out;
}

}  // namespace
}  // namespace train_state_cli
}  // namespace gradscope
