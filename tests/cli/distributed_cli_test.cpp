// Several ranks as processes, on c10d's Gloo: `gradscope run --nproc 2 --shard MODE` against one
// process of the global batch (every mode), ranks started as torchrun starts them, `verify
// --nproc 2`, a rank killed (the others stop and the run is recorded as crashed), and a run
// resumed from every rank's state after a SIGKILL.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "gradscope/core/json_input.h"
#include "gradscope/core/record.h"
#include "gradscope/comm/comm.h"
#include "gradscope/train/train_state.h"
#include "test_util.h"

namespace gradscope {
namespace distributed_cli {
namespace {

// The tiny Llama with dropout off (ranks draw other masks than one process would), one thread
// per rank.
std::string args(int64_t batch, int64_t steps, const std::string& extra) {
  return fmt::format(
      "run --model llama --preset tiny --seq 32 --batch {} --steps {} --warmup-steps 1 "
      "--dropout 0 --eval-batches 1 --threads 1 --optimizer adam --lr 0.003 --sample-period 0 "
      "--dataset {} --quiet --no-db {}",
      batch, steps, testing::fixture("text/sotu-excerpt.txt"), extra);
}

RunRecord record_file(const std::string& path) {
  return record_from_json(parse_json_input(testing::slurp(path), path));
}

int exit_code_of(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

bool poll(const std::function<bool()>& done, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return done();
}

int64_t state_step(const std::string& dir) {
  try {
    return read_train_state_info(dir).step;
  } catch (const std::exception&) {
    return -1;
  }
}

void expect_same_losses(const RunRecord& got, const RunRecord& want, double tolerance,
                        const std::string& what) {
  ASSERT_EQ(got.steps.size(), want.steps.size()) << what;
  for (size_t i = 0; i < want.steps.size(); ++i) {
    ASSERT_TRUE(got.steps[i].loss && want.steps[i].loss) << what;
    EXPECT_NEAR(*got.steps[i].loss, *want.steps[i].loss, tolerance * *want.steps[i].loss)
        << what << ", step " << i + 1;
    EXPECT_EQ(got.steps[i].samples, want.steps[i].samples) << what;
  }
  ASSERT_TRUE(got.final_val_loss && want.final_val_loss) << what;
  EXPECT_NEAR(*got.final_val_loss, *want.final_val_loss, tolerance * *want.final_val_loss) << what;
}

// The pid of the child of `parent` started `nth` (0-based), -1 if none.
pid_t child_of(pid_t parent, int nth) {
  const std::string list = testing::slurp(fmt::format("/proc/{}/task/{}/children", parent, parent));
  std::istringstream in(list);
  pid_t pid = -1;
  for (int i = 0; i <= nth; ++i)
    if (!(in >> pid)) return -1;
  return pid;
}

TEST(DistributedCli, EveryModeComputesTheStepOfOneProcess) {
  testing::TempDir dir("gradscope-dist");
  const auto one = testing::run_gradscope(args(4, 4, "--json " + dir.file("one.json")));
  ASSERT_EQ(one.code, 0) << one.err;
  const RunRecord reference = record_file(dir.file("one.json"));
  std::map<std::string, RankFigures> rank0;
  std::map<std::string, std::vector<std::optional<double>>> losses;
  for (const std::string label : {"ddp", "zero1", "zero2", "fsdp", "fsdp reduce-scatter"}) {
    const std::string mode = label.substr(0, label.find(' '));
    const bool scatter = label != mode;
    const std::string json = dir.file(mode + (scatter ? "-rs" : "") + ".json");
    const auto r = testing::run_gradscope(
        args(2, 4, fmt::format("--nproc 2 --shard {} --json {}{}", mode, json,
                               scatter ? " --grad-reduce reduce-scatter" : "")));
    ASSERT_EQ(r.code, 0) << label << ": " << r.err;
    const RunRecord got = record_file(json);
    // A reordered float32 sum over the batch: a few units of 2^-24 relative.
    expect_same_losses(got, reference, 1e-5, label);
    for (const auto& step : got.steps) losses[label].push_back(step.loss);
    EXPECT_EQ(got.config.grad_reduce, scatter ? GradReduce::kReduceScatter
                                              : GradReduce::kAllReduce) << label;
    ASSERT_TRUE(got.distributed.has_value()) << label;
    const RunDistributed& d = *got.distributed;
    EXPECT_EQ(d.world, 2);
    EXPECT_EQ(d.shard, mode);
    EXPECT_EQ(d.launcher, "gradscope");
    ASSERT_EQ(d.ranks.size(), 2u) << mode;
    EXPECT_EQ(d.ranks[0].rank, 0);
    EXPECT_EQ(d.ranks[1].rank, 1);
    for (const RankFigures& f : d.ranks) {
      EXPECT_GT(f.peak_bytes, 0);
      ASSERT_TRUE(f.bytes_sent_per_step.has_value());
      EXPECT_GT(*f.bytes_sent_per_step, 0);
      ASSERT_TRUE(f.comm_s.has_value());
    }
    rank0[label] = d.ranks[0];
  }
  // Gloo's reduce-scatter is an all-reduce and a copy of the chunk: the same sums, bit for
  // bit, and the same bytes sent.
  EXPECT_EQ(losses["fsdp reduce-scatter"], losses["fsdp"]);
  EXPECT_EQ(*rank0["fsdp reduce-scatter"].bytes_sent_per_step,
            *rank0["fsdp"].bytes_sent_per_step);
  // ... and Gloo's copy of the block's flat gradient beside it, which fsdp's tally counts.
  EXPECT_GT(rank0["fsdp reduce-scatter"].collective_buffer_peak_bytes,
            rank0["fsdp"].collective_buffer_peak_bytes);
  // Per-rank state: zero1, zero2 and fsdp hold half of ddp's Adam moments (to the padding of
  // the flat space); gradients: zero2 and fsdp keep half, ddp and zero1 all of them.
  const double state = static_cast<double>(rank0["ddp"].optimizer_state_bytes);
  const double grads = static_cast<double>(*rank0["ddp"].grads_bytes);
  EXPECT_EQ(rank0["ddp"].optimizer_state_bytes, *reference.memory->grads_bytes * 2)
      << "ddp holds the one process's state";
  for (const char* mode : {"zero1", "zero2", "fsdp"})
    EXPECT_NEAR(static_cast<double>(rank0[mode].optimizer_state_bytes), state / 2, 64) << mode;
  EXPECT_EQ(*rank0["zero1"].grads_bytes, *rank0["ddp"].grads_bytes);
  for (const char* mode : {"zero2", "fsdp"})
    EXPECT_NEAR(static_cast<double>(*rank0[mode].grads_bytes), grads / 2, 64) << mode;
  // fsdp keeps only its shard of the blocks' parameters.
  EXPECT_LT(rank0["fsdp"].params_bytes, rank0["ddp"].params_bytes);
}

TEST(DistributedCli, RanksStartedAsTorchrunStartsThemMeetAndAgree) {
  testing::TempDir dir("gradscope-torchrun");
  // A free port, as a launcher would pick one.
  int port = 0;
  {
    const int s = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t n = sizeof a;
    getsockname(s, reinterpret_cast<sockaddr*>(&a), &n);
    port = ntohs(a.sin_port);
    close(s);
  }
  const std::string common = args(2, 3, "--nproc 2 --shard zero2");
  std::vector<pid_t> ranks;
  for (int r = 0; r < 2; ++r) {
    const std::string env = fmt::format(
        "env RANK={} WORLD_SIZE=2 LOCAL_RANK={} MASTER_ADDR=127.0.0.1 MASTER_PORT={} ", r, r, port);
    // start_gradscope execs the binary; the variables go in front through env(1).
    const pid_t pid = fork();
    if (pid == 0) {
      const std::string cmd = "exec " + env + GRADSCOPE_BINARY + " " + common + " --json " +
                              dir.file(fmt::format("r{}.json", r)) + " >" +
                              dir.file(fmt::format("r{}.out", r)) + " 2>&1 </dev/null";
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    ranks.push_back(pid);
  }
  EXPECT_EQ(exit_code_of(ranks[0]), 0) << testing::slurp(dir.file("r0.out"));
  EXPECT_EQ(exit_code_of(ranks[1]), 0) << testing::slurp(dir.file("r1.out"));
  const RunRecord got = record_file(dir.file("r0.json"));
  EXPECT_EQ(got.distributed->launcher, "torchrun");
  EXPECT_EQ(got.distributed->ranks.size(), 2u);
  // Rank 1 writes no record.
  EXPECT_FALSE(std::filesystem::exists(dir.file("r1.json")));
  const auto launched = testing::run_gradscope(
      args(2, 3, "--nproc 2 --shard zero2 --json " + dir.file("launched.json")));
  ASSERT_EQ(launched.code, 0) << launched.err;
  expect_same_losses(got, record_file(dir.file("launched.json")), 0, "torchrun against --nproc");
}

TEST(DistributedCli, VerifyProvesEveryModeAgainstOneProcess) {
  const auto r = testing::run_gradscope(
      "verify --model llama --preset tiny --seq 32 --nproc 2 --dtype fp32 --dataset " +
      testing::fixture("text/sotu-excerpt.txt"));
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  for (const char* mode :
       {"ddp x2", "zero1 x2", "zero2 x2", "fsdp x2", "fsdp reduce-scatter x2"})
    EXPECT_TRUE(testing::contains(r.out, mode)) << r.out;
  EXPECT_TRUE(testing::contains(r.out, "fp32: 10 of 10 checks hold")) << r.out;
}

TEST(DistributedCli, ARankThatDiesStopsTheOthersAndTheRunIsCrashed) {
  testing::TempDir dir("gradscope-dead-rank");
  const std::string state = dir.file("state");
  const pid_t launcher = testing::start_gradscope(
      args(2, 100000,
           fmt::format("--nproc 2 --shard ddp --dist-timeout 30 --save-state {} --state-every 1 "
                       "--json {}",
                       state, dir.file("r.json"))),
      dir.file("out"));
  // Training has begun once rank 1 saved a state.
  ASSERT_TRUE(poll([&] { return state_step(state + "/rank-1") >= 1; }, 60))
      << testing::slurp(dir.file("out"));
  const pid_t rank1 = child_of(launcher, 1);
  ASSERT_GT(rank1, 0);
  const auto killed_at = std::chrono::steady_clock::now();
  kill(rank1, SIGKILL);
  EXPECT_EQ(exit_code_of(launcher), 1) << testing::slurp(dir.file("out"));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_LT(took, 30) << "the others must stop well before --dist-timeout";
  const RunRecord r = record_file(dir.file("r.json"));
  EXPECT_EQ(r.status, RunStatus::kCrashed);
  ASSERT_TRUE(r.failure.has_value());
  EXPECT_TRUE(testing::contains(r.failure->message, "rank 0")) << r.failure->message;
  EXPECT_TRUE(testing::contains(testing::slurp(dir.file("out")), "rank 1 was killed"));
}

TEST(DistributedCli, EveryRanksStateResumesAfterASigkill) {
  testing::TempDir dir("gradscope-dist-resume");
  constexpr int64_t kSteps = 40;
  for (const char* mode : {"zero2", "fsdp"}) {
    const std::string m = mode;
    const auto whole = testing::run_gradscope(args(
        2, kSteps, fmt::format("--nproc 2 --shard {} --json {}", m, dir.file(m + "-whole.json"))));
    ASSERT_EQ(whole.code, 0) << whole.err;
    const std::string state = dir.file(m + "-state");
    const std::string killed_args = args(
        2, kSteps, fmt::format("--nproc 2 --shard {} --save-state {} --state-every 2", m, state));
    const pid_t launcher = testing::start_gradscope(
        killed_args + " --json " + dir.file(m + "-1.json"), dir.file(m + ".out"));
    ASSERT_TRUE(poll([&] { return state_step(state + "/rank-0") >= 6; }, 60));
    const pid_t rank0 = child_of(launcher, 0), rank1 = child_of(launcher, 1);
    // The ranks die with the launcher that started them.
    kill(launcher, SIGKILL);
    EXPECT_EQ(exit_code_of(launcher), 128 + SIGKILL);
    ASSERT_TRUE(poll([&] { return kill(rank0, 0) != 0 && kill(rank1, 0) != 0; }, 30))
        << "a rank outlived its launcher";
    const int64_t k0 = state_step(state + "/rank-0"), k1 = state_step(state + "/rank-1");
    ASSERT_GE(k0, 6);
    if (k0 != k1) {
      // Killed between the two ranks' saves of one step: refused, not resumed from two steps.
      const auto refused = testing::run_gradscope(killed_args + " --resume " + state + " --json " +
                                                  dir.file("x.json"));
      EXPECT_NE(refused.code, 0);
      continue;
    }
    const auto resumed = testing::run_gradscope(killed_args + " --resume " + state + " --json " +
                                                dir.file(m + "-2.json"));
    ASSERT_EQ(resumed.code, 0) << resumed.err;
    const RunRecord after = record_file(dir.file(m + "-2.json"));
    EXPECT_EQ(after.resumed_from_steps, std::vector<int64_t>{k0});
    expect_same_losses(after, record_file(dir.file(m + "-whole.json")), 0, m);
  }
}

TEST(DistributedCli, BadSettingsAreRefusedBeforeAnyRankStarts) {
  testing::TempDir dir("gradscope-dist-refused");
  const std::string base = args(2, 2, "--json " + dir.file("r.json"));
  for (const auto& [extra, expected] : std::vector<std::pair<std::string, std::string>>{
           {"--nproc 2", "--shard"},
           {"--nproc 0 --shard ddp", "--nproc 0"},
           {"--nproc 2 --shard zero1 --optimizer galore", "galore"},
           {"--nproc 2 --shard ddp --strategy fused", "inside backward"},
           {"--nproc 2 --shard ddp --bucket-size 10", "bucket-size"},
           {"--nproc 2 --shard zero2 --grad-reduce reduce-scatter", "--grad-reduce"},
           {"--nproc 2 --shard fsdp --grad-reduce scatter", "--grad-reduce"},
           {"--shard sharded", "shard"}}) {
    const auto r = testing::run_gradscope(base + " " + extra);
    EXPECT_EQ(r.code, 2) << extra << ": " << r.err;
    EXPECT_TRUE(testing::contains(r.err, expected)) << extra << ": " << r.err;
  }
  // A launcher's variables that cannot be read.
  const auto r = testing::run_gradscope(base + " --nproc 2 --shard ddp",
                                        "RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(testing::contains(r.err, "MASTER_PORT")) << r.err;
}

}  // namespace
}  // namespace distributed_cli
}  // namespace gradscope
