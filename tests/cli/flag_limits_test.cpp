// Where usage ends and measurement begins: flag and environment values that cannot be
// represented where they are used, or that this machine cannot give, are usage errors (exit 2,
// naming the input) before anything runs; a representable value that goes wrong in training
// is still a run with its status. Each command is bounded (a time limit, and a memory limit
// where the unchecked value would grow without end).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gradscope/core/env.h"
#include "test_util.h"

namespace gradscope {
namespace {

using testing::contains;
using testing::run_gradscope;

const std::string kLimitsRun =
    std::string(
        "run --model llama --preset tiny --seq 32 --batch 2 --steps 2 --warmup-steps 0 "
        "--eval-batches 1 --quiet --no-db --dataset ") +
    GRADSCOPE_FIXTURES + "/text/sotu-excerpt.txt";

// A sweep file whose seed axis lists `count` values (0, 1, ...), then `extra` ones.
std::string seed_axis_sweep(const testing::TempDir& dir, int64_t count, const std::string& extra) {
  const std::string path = dir.file("axis.toml");
  std::ofstream out(path);
  out << "[fixed]\nmodel = \"llama\"\npreset = \"tiny\"\n[axes]\nseed = [";
  for (int64_t i = 0; i < count; ++i) out << (i ? "," : "") << i;
  out << extra << "]\n";
  return path;
}

TEST(FlagLimits, AnAxisBeyondTheRunCapIsRefusedBeforeItsValuesAreChecked) {
  testing::TempDir dir;
  const std::string file = seed_axis_sweep(dir, 1000000, "");
  // Unchecked, the duplicate check compared every value with every earlier one (minutes).
  const auto r = run_gradscope("sweep " + file + " --dry-run --db " + dir.file("r.db"),
                               "timeout 30");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "axis 'seed' has 1000000 values")) << r.err;
  EXPECT_TRUE(contains(r.err, "more than the cap of 100000")) << r.err;
}

TEST(FlagLimits, ARepeatedValueInAnAxisAtTheCapIsFoundAtOnce) {
  testing::TempDir dir;
  const std::string file = seed_axis_sweep(dir, 99999, ",5");  // 100000 values, the cap
  const auto r = run_gradscope("sweep " + file + " --dry-run --db " + dir.file("r.db"),
                               "timeout 10");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "axis 'seed' lists '5' twice")) << r.err;
}

TEST(FlagLimits, ThreadsBeyondTheMachinesLimitAreRefused) {
  testing::TempDir dir;
  // Unchecked, LibTorch's pool creates threads until the address space (here 8 GiB) is full.
  const auto r = run_gradscope(kLimitsRun + " --threads 100000 --json " + dir.file("r.json"),
                               "ulimit -v 8388608; timeout 60");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, fmt::format("--threads 100000 is more than this machine allows: at "
                                          "most {} (4 x its {} usable cores)",
                                          max_threads_here(), usable_cores())))
      << r.err;
  EXPECT_FALSE(std::ifstream(dir.file("r.json")).good());
  // The limit itself is allowed.
  const auto ok = run_gradscope(
      kLimitsRun + fmt::format(" --threads {} --json ", max_threads_here()) + dir.file("ok.json"),
      "timeout 120");
  EXPECT_EQ(ok.code, 0) << ok.err;
}

TEST(FlagLimits, RanksBeyondTheMachinesLimitAreRefusedBeforeAnyStarts) {
  testing::TempDir dir;
  const int64_t over = max_local_ranks_here() + 1;
  const auto r = run_gradscope(
      kLimitsRun + fmt::format(" --nproc {} --shard ddp --dist-timeout 20 --json ", over) +
          dir.file("r.json"),
      "timeout 120");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, fmt::format("--nproc {} starts more ranks than this machine allows: "
                                          "at most {} (its {} usable cores + 4)",
                                          over, max_local_ranks_here(), usable_cores())))
      << r.err;
  EXPECT_FALSE(std::ifstream(dir.file("r.json")).good());
}

TEST(FlagLimits, ARateBeyondFloat32IsAUsageErrorAndARepresentableOneThatBlowsUpDiverges) {
  testing::TempDir dir;
  // Beyond float32's range, and so small that float32 makes it 0.
  for (const std::string lr : {"1e300", "1e-50"}) {
    const auto r = run_gradscope(kLimitsRun + " --lr " + lr + " --json " + dir.file("r.json"),
                                 "timeout 120");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "--lr " + lr + " cannot be represented as a float32")) << r.err;
    EXPECT_FALSE(std::ifstream(dir.file("r.json")).good());
  }

  // Within float32, a rate that blows the loss up is a measured run: status diverged.
  const auto big = run_gradscope(kLimitsRun + " --optimizer sgd --lr 1e30 --steps 5 --json " +
                                     dir.file("big.json"),
                                 "timeout 120");
  std::ifstream in(dir.file("big.json"));
  ASSERT_TRUE(in.good()) << big.err;
  const nlohmann::json record = nlohmann::json::parse(in);
  EXPECT_EQ(record.at("status"), "diverged") << big.err;
}

TEST(FlagLimits, BatchesWhoseBuffersCannotBeSizedAreUsageErrors) {
  testing::TempDir dir;
  for (const std::string flag : {"--batch", "--accum-steps"}) {
    SCOPED_TRACE(flag);
    const auto r = run_gradscope(kLimitsRun + " " + flag + " 1099511627776 --json " +
                                     dir.file("r.json"),
                                 "ulimit -v 8388608; timeout 120");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "more than a process can address")) << r.err;
    EXPECT_TRUE(contains(r.err, flag + " 1099511627776")) << r.err;
    EXPECT_FALSE(std::ifstream(dir.file("r.json")).good());
  }
}

TEST(FlagLimits, AMemoryCapBelowTheParametersNamesTheirSize) {
  testing::TempDir dir;
  const auto r = run_gradscope(kLimitsRun + " --memory-cap 1B --json " + dir.file("r.json"),
                               "timeout 120");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "--memory-cap 1 B is below the")) << r.err;
  EXPECT_TRUE(contains(r.err, "that llama's parameters alone need")) << r.err;
  EXPECT_FALSE(contains(r.err, "--arch")) << r.err;
}

TEST(FlagLimits, ASamplePeriodBelowAMillisecondIsRefused) {
  testing::TempDir dir;
  const auto r = run_gradscope(kLimitsRun + " --sample-period 1e-12 --json " + dir.file("r.json"),
                               "timeout 120");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "--sample-period must be 0 (no sampler) or at least 0.001 s"))
      << r.err;
  EXPECT_FALSE(std::ifstream(dir.file("r.json")).good());
}

TEST(FlagLimits, RanksALauncherStartedAreRefusedWithoutNproc) {
  testing::TempDir dir;
  // torchrun's variables, --nproc left at 1: each rank would store the whole run.
  for (const std::string rank : {"0", "1"}) {
    const auto r = run_gradscope(kLimitsRun + " --json " + dir.file("r" + rank + ".json"),
                                 "timeout 60 env WORLD_SIZE=2 RANK=" + rank +
                                     " LOCAL_RANK=" + rank + " MASTER_PORT=29500");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "started this process as rank " + rank +
                                    " of 2, but --nproc is 1"))
        << r.err;
    EXPECT_FALSE(std::ifstream(dir.file("r" + rank + ".json")).good());
  }
  // A rank beyond the world is bad input too.
  const auto r = run_gradscope(kLimitsRun + " --json " + dir.file("r5.json"),
                               "timeout 60 env WORLD_SIZE=2 RANK=5 MASTER_PORT=29500");
  EXPECT_EQ(r.code, 2) << r.err;
}

TEST(FlagLimits, AnUnknownOptimizerSettingInASweepIsRefusedWhenPlanned) {
  testing::TempDir dir;
  const std::string file = dir.file("bogus.toml");
  std::ofstream(file) << "name = \"bogus\"\n[fixed]\nmodel = \"llama\"\npreset = \"tiny\"\n"
                         "steps = 2\n[fixed.opt]\nbogus = 0.9\n[axes]\nseed = [0]\n"
                         "optimizer = [\"sgd\"]\n";
  for (const std::string dry : {" --dry-run", ""}) {
    const auto r = run_gradscope("sweep " + file + dry + " --db " + dir.file("s.db"),
                                 "timeout 120");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "optimizer 'sgd' has no setting 'bogus'")) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir.file("s.db")));
  }
  // A dry run of a good file only reads: it leaves no database behind.
  std::ofstream(file) << "name = \"good\"\n[fixed]\nmodel = \"llama\"\npreset = \"tiny\"\n"
                         "steps = 2\n[fixed.opt]\nmomentum = 0.9\n[axes]\nseed = [0]\n"
                         "optimizer = [\"sgd\"]\n";
  const auto dry = run_gradscope("sweep " + file + " --dry-run --db " + dir.file("s.db"),
                                 "timeout 120");
  EXPECT_EQ(dry.code, 0) << dry.err;
  EXPECT_TRUE(contains(dry.out, "1 to run")) << dry.out;
  EXPECT_FALSE(std::filesystem::exists(dir.file("s.db")));
}

TEST(FlagLimits, SlurmIdsOutOfRangeAreRefusedNamingTheVariable) {
  testing::TempDir dir;
  // A job step of two ranks as srun starts it, without MASTER_PORT: the port comes from the ids.
  const std::string step =
      "SLURM_NTASKS=2 SLURM_PROCID=0 SLURM_STEP_ID=0 SLURM_NODELIST=localhost "
      "GRADSCOPE_RANK_LAUNCHER= RANK= WORLD_SIZE= MASTER_PORT= MASTER_ADDR= ";
  for (const std::string variable : {"SLURM_JOB_ID", "SLURM_STEP_ID"}) {
    SCOPED_TRACE(variable);
    const auto r = run_gradscope(
        kLimitsRun + " --nproc 2 --shard ddp --dist-timeout 5 --json " + dir.file("r.json"),
        "timeout 60 env " + step + variable + "=100000000000000000000000");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "environment variable " + variable +
                                    "='100000000000000000000000' is not a whole number"))
        << r.err;
  }
}

}  // namespace
}  // namespace gradscope
