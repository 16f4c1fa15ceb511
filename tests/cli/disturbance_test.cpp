// A run beside busy loops on every core records what competed with it and is marked disturbed,
// in its record and in the database; a sweep started on such a machine warns.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gradscope/core/env.h"
#include "gradscope/store/db.h"
#include "test_util.h"

namespace gradscope {
namespace {

using testing::contains;
using testing::run_gradscope;

// Busy loops, one per core, for as long as the object lives (each at most 120 s).
class BusyCores {
 public:
  BusyCores() {
    for (int64_t i = 0; i < usable_cores(); ++i) {
      const pid_t pid = fork();
      if (pid == 0) {
        alarm(120);
        for (volatile unsigned long n = 0;; n = n + 1) {
        }
      }
      if (pid > 0) pids_.push_back(pid);
    }
  }
  ~BusyCores() {
    for (pid_t pid : pids_) kill(pid, SIGKILL);
    for (pid_t pid : pids_) waitpid(pid, nullptr, 0);
  }
  BusyCores(const BusyCores&) = delete;
  BusyCores& operator=(const BusyCores&) = delete;

 private:
  std::vector<pid_t> pids_;
};

const std::string kBusyRun =
    std::string(
        "run --model llama --preset tiny --seq 32 --batch 4 --steps 30 --warmup-steps 2 "
        "--eval-batches 1 --quiet --dataset ") +
    GRADSCOPE_FIXTURES + "/text/sotu-excerpt.txt";

TEST(Disturbance, ARunBesideBusyCoresIsMarkedInItsRecordAndTheDatabase) {
  testing::TempDir dir;
  testing::CommandResult r;
  {
    BusyCores busy;
    r = run_gradscope(kBusyRun + fmt::format(" --threads {} --json {} --db {}", usable_cores(),
                                         dir.file("r.json"), dir.file("r.db")),
                      "timeout 300");
  }
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream in(dir.file("r.json"));
  const nlohmann::json record = nlohmann::json::parse(in);
  ASSERT_TRUE(record.contains("contention")) << record.dump();
  const nlohmann::json& c = record.at("contention");
  EXPECT_EQ(c.at("window"), "timed steps");
  EXPECT_EQ(c.at("steps"), 30);
  EXPECT_TRUE(c.at("disturbed").get<bool>()) << c.dump();
  EXPECT_FALSE(c.at("reasons").empty()) << c.dump();
  EXPECT_GE(c.at("competing_tasks_mean").get<double>(), 0.5) << c.dump();
  // Per timed step, not for the warm-up.
  const nlohmann::json& steps = record.at("steps");
  EXPECT_FALSE(steps.at(0).contains("involuntary_switches"));
  EXPECT_TRUE(steps.at(2).contains("involuntary_switches"));
  EXPECT_TRUE(steps.at(2).contains("competing_tasks"));
  Database db(dir.file("r.db"));
  const std::vector<RunRecord> stored = db.records();
  ASSERT_EQ(stored.size(), 1u);
  ASSERT_TRUE(stored[0].contention);
  EXPECT_TRUE(stored[0].contention->disturbed);
}

TEST(Disturbance, ASweepStartedOnABusyMachineWarns) {
  testing::TempDir dir;
  const std::string file = dir.file("one.toml");
  std::ofstream(file) << "name = \"one\"\n[fixed]\nmodel = \"llama\"\npreset = \"tiny\"\n"
                      << "seq = 32\nbatch = 2\neval_batches = 1\nwarmup_steps = 0\nsteps = 2\n"
                      << "dataset = \"" << testing::fixture("text/sotu-excerpt.txt") << "\"\n";
  testing::CommandResult r;
  {
    BusyCores busy;
    r = run_gradscope("sweep " + file + " --db " + dir.file("s.db"), "timeout 300");
  }
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "this machine is busy:")) << r.err;
  EXPECT_TRUE(contains(r.err, "runnable tasks on average besides this sweep")) << r.err;
}

}  // namespace
}  // namespace gradscope
