// The training state across processes: `gradscope run` killed with SIGKILL after its state for
// some step appeared, or stopped with SIGTERM (exit 75, status interrupted), and resumed with
// --resume, gives the losses and final weights of the run trained in one go, bit for bit.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <sstream>
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
  EXPECT_EQ(after_kill.status, RunStatus::kOk);
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
  EXPECT_EQ(interrupted.status, RunStatus::kInterrupted);
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
            (std::vector<RunStatus>{RunStatus::kInterrupted, RunStatus::kOk}));

  // A resume with another setting is refused before anything is written.
  const auto other = testing::run_gradscope(run_args(
      "--no-db --json " + file("other.json") + " --seed 7 --resume " + file("stopped-state")));
  EXPECT_EQ(other.code, 2);
  EXPECT_TRUE(testing::contains(other.err, "--seed")) << other.err;
  EXPECT_FALSE(std::filesystem::exists(file("other.json")));
}

// The size of the largest file under `dir` whose name ends in `suffix` (or does not, with
// `except`).
uintmax_t largest_file(const std::string& dir, const std::string& suffix, bool except) {
  uintmax_t largest = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    const std::string name = entry.path().filename().string();
    const bool ends = name.size() >= suffix.size() &&
                      name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    if (ends != except) largest = std::max<uintmax_t>(largest, entry.file_size());
  }
  return largest;
}

std::vector<std::string> saving_folders(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (testing::contains(entry.path().filename().string(), ".saving-"))
      out.push_back(entry.path().string());
  return out;
}

// A save that cannot write its files (here: a file-size limit, as a full disk) neither ends
// nor loses the run: a periodic save warns (the path and the OS error) and training goes on;
// a save at SIGTERM still records the run interrupted with the reason; the previous state
// stays whole and no half-written folder is left. LibTorch's own file writer aborted the
// process here (it throws from its destructor).
TEST(TrainStateCli, SavesThatCannotBeWrittenLoseNothing) {
  testing::TempDir dir("gradscope-state-full");
  const auto file = [&](const std::string& name) { return dir.file(name); };
  const std::string state = file("state");
  const std::string args =
      run_args(fmt::format("--save-state {} --state-every 2 --resume {}", state, state));
  // A state of step 2 or later, written without a limit (--resume of an empty folder is
  // refused, so the first run saves without it).
  const pid_t first = testing::start_gradscope(
      run_args(fmt::format("--db {} --json {} --save-state {} --state-every 2", file("a.db"),
                           file("a.json"), state)),
      file("a.out"));
  ASSERT_TRUE(poll([&] { return state_step(state) >= 2; }, 120));
  kill(first, SIGTERM);
  ASSERT_EQ(exit_code_of(first), 75) << testing::slurp(file("a.out"));
  const int64_t kept = state_step(state);
  ASSERT_GE(kept, 2);
  const auto kept_weights = read_state_weights(state);
  // Files of up to `limit` bytes can be written: the record and the database fit, the
  // state's archives do not.
  const uintmax_t small = largest_file(dir.path(), ".pt", /*except=*/true);
  const uintmax_t archives = largest_file(state, ".pt", /*except=*/false);
  ASSERT_LT(small * 2, archives) << "the tiny model's archives are not the largest files";
  const std::string limit = fmt::format("ulimit -f {}; trap '' XFSZ;", small * 2 / 1024 + 1);

  // Periodic saves fail: each warns, the run finishes and is recorded.
  const auto resumed = testing::run_gradscope(
      args + fmt::format(" --db {} --json {}", file("b.db"), file("b.json")), limit);
  EXPECT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_TRUE(testing::contains(resumed.err, "could not be saved")) << resumed.err;
  EXPECT_TRUE(testing::contains(resumed.err, state)) << resumed.err;
  EXPECT_TRUE(testing::contains(resumed.err, std::strerror(EFBIG))) << resumed.err;
  ASSERT_TRUE(std::filesystem::exists(file("b.json"))) << resumed.err;
  EXPECT_EQ(record_file(file("b.json")).status, RunStatus::kOk);
  EXPECT_EQ(Database(file("b.db")).count_runs(), 1);
  EXPECT_TRUE(saving_folders(dir.path()).empty());
  // The previous state is whole.
  EXPECT_EQ(state_step(state), kept);
  const auto weights = read_state_weights(state);
  ASSERT_EQ(weights.size(), kept_weights.size());
  for (size_t i = 0; i < weights.size(); ++i)
    EXPECT_TRUE(torch::equal(weights[i].second, kept_weights[i].second)) << weights[i].first;

  // SIGTERM after a periodic save failed: the save at the stop fails too, and the run is
  // recorded interrupted, saying which state is left.
  const pid_t stopped = testing::start_gradscope(
      fmt::format("{} --db {} --json {}", args, file("c.db"), file("c.json")), file("c.out"),
      limit);
  ASSERT_TRUE(poll([&] { return testing::contains(testing::slurp(file("c.out")), "could not be"); },
                   120))
      << testing::slurp(file("c.out"));
  kill(stopped, SIGTERM);
  ASSERT_EQ(exit_code_of(stopped), 75) << testing::slurp(file("c.out"));
  ASSERT_TRUE(std::filesystem::exists(file("c.json"))) << testing::slurp(file("c.out"));
  const RunRecord interrupted = record_file(file("c.json"));
  EXPECT_EQ(interrupted.status, RunStatus::kInterrupted);
  ASSERT_TRUE(interrupted.failure);
  if (*interrupted.failure->step != kSteps)
    EXPECT_TRUE(testing::contains(interrupted.failure->message, "could not be saved"))
        << interrupted.failure->message;
  EXPECT_EQ(Database(file("c.db")).count_runs(), 1);
  EXPECT_TRUE(saving_folders(dir.path()).empty());
  EXPECT_EQ(state_step(state), kept);
}

// Whether process `pid` runs the gradscope binary and catches SIGTERM (its handler is in place).
bool catches_sigterm(pid_t pid) {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink(fmt::format("/proc/{}/exe", pid), ec);
  if (ec || exe != std::filesystem::canonical(GRADSCOPE_BINARY, ec)) return false;
  std::istringstream status(testing::slurp(fmt::format("/proc/{}/status", pid)));
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("SigCgt:", 0) == 0)
      return ((std::stoull(line.substr(7), nullptr, 16) >> (SIGTERM - 1)) & 1) != 0;
  return false;
}

// SIGTERM again and again, every few milliseconds from the moment the handler is in place until
// the process ends (a scheduler and a sweep each sending theirs, a user's kill repeated): the
// run records itself interrupted and exits 75, whichever moment a signal lands on (during the
// save, the record, or the exit after it).
TEST(TrainStateCli, RepeatedStopsEndTheRunRecordedAndWithItsExitCode) {
  testing::TempDir dir("gradscope-state-stops");
  for (int attempt = 0; attempt < 3; ++attempt) {
    const std::string json = dir.file(fmt::format("r{}.json", attempt));
    const std::string out = dir.file(fmt::format("r{}.out", attempt));
    const pid_t pid = testing::start_gradscope(
        fmt::format("run --model llama --preset tiny --seq 32 --batch 2 --steps 100000 --quiet "
                    "--threads 1 --dataset {} --db {} --json {} --save-state {}",
                    testing::fixture("text/sotu-excerpt.txt"), dir.file("r.db"), json,
                    dir.file(fmt::format("state-{}", attempt))),
        out);
    ASSERT_TRUE(poll([&] { return catches_sigterm(pid); }, 120)) << testing::slurp(out);
    int status = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (waitpid(pid, &status, WNOHANG) == 0 && std::chrono::steady_clock::now() < until) {
      kill(pid, SIGTERM);
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
    }
    ASSERT_TRUE(WIFEXITED(status)) << "ended by signal " << WTERMSIG(status) << ": "
                                   << testing::slurp(out);
    EXPECT_EQ(WEXITSTATUS(status), 75) << testing::slurp(out);
    ASSERT_TRUE(std::filesystem::exists(json)) << testing::slurp(out);
    EXPECT_EQ(record_file(json).status, RunStatus::kInterrupted);
  }
  EXPECT_EQ(Database(dir.file("r.db")).count_runs(), 3);
}

TEST(TrainStateCli, HelpNamesTheStoppedExitCode) {
  const auto help = testing::run_gradscope("run --help");
  EXPECT_TRUE(testing::contains(help.out, "75 when SIGTERM or SIGINT")) << help.out;
  EXPECT_TRUE(testing::contains(help.out, "--save-state")) << help.out;
}

}  // namespace
}  // namespace train_state_cli
}  // namespace gradscope
