// Where ranks come from (torchrun's and Slurm's variables), and the collectives on c10d's Gloo
// between two ranks of this process (threads), through the store a launcher hosts.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "gradscope/core/error.h"
#include "gradscope/comm/comm.h"
#include "gradscope/measure/memory.h"
#include "test_util.h"

namespace gradscope {
namespace {

// Sets launcher variables for one test and puts back what was there.
class Environment {
 public:
  explicit Environment(const std::map<std::string, std::string>& values) {
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                             "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODELIST",
                             "SLURM_STEP_NODELIST", "SLURM_JOB_ID", kLauncherVariable}) {
      const char* v = std::getenv(name);
      if (v) saved_[name] = v;
      unsetenv(name);
    }
    for (const auto& [k, v] : values) setenv(k.c_str(), v.c_str(), 1);
    set_ = values;
  }
  ~Environment() {
    for (const auto& [k, v] : set_) unsetenv(k.c_str());
    for (const auto& [k, v] : saved_) setenv(k.c_str(), v.c_str(), 1);
  }

 private:
  std::map<std::string, std::string> saved_, set_;
};

TEST(Comm, SlurmNodeListsGiveTheirFirstHost) {
  EXPECT_EQ(first_slurm_host("node07"), "node07");
  EXPECT_EQ(first_slurm_host("node[03-05,9],gpu1"), "node03");
  EXPECT_EQ(first_slurm_host("gpu[12,14]"), "gpu12");
  EXPECT_EQ(first_slurm_host("a-1.cluster,b"), "a-1.cluster");
  for (const char* bad : {"", "node[01", "no de", "x;rm -rf /", "$(id)"})
    testing::expect_usage_error([&] { first_slurm_host(bad); });
}

TEST(Comm, TorchrunVariablesNameTheRank) {
  {
    const Environment env({});
    EXPECT_FALSE(rank_env_from_environment().has_value());
  }
  {
    const Environment env({{"RANK", "1"},
                           {"WORLD_SIZE", "4"},
                           {"LOCAL_RANK", "1"},
                           {"MASTER_ADDR", "10.0.0.5"},
                           {"MASTER_PORT", "29511"}});
    const auto e = rank_env_from_environment();
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->rank, 1);
    EXPECT_EQ(e->world, 4);
    EXPECT_EQ(e->local_rank, 1);
    EXPECT_EQ(e->master_addr, "10.0.0.5");
    EXPECT_EQ(e->master_port, 29511);
    EXPECT_EQ(e->launcher, "torchrun");
    EXPECT_FALSE(e->store_hosted);
  }
  {
    // One rank is one process: nothing to meet.
    const Environment env({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
    EXPECT_FALSE(rank_env_from_environment().has_value());
  }
  for (const auto& bad : std::vector<std::map<std::string, std::string>>{
           {{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}},
           {{"RANK", "x"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}},
           {{"RANK", "0"}, {"WORLD_SIZE", "2"}},
           {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}}) {
    const Environment env(bad);
    testing::expect_usage_error([] { rank_env_from_environment(); });
  }
}

TEST(Comm, SlurmVariablesNameTheRank) {
  const Environment env({{"SLURM_PROCID", "3"},
                         {"SLURM_NTASKS", "4"},
                         {"SLURM_LOCALID", "1"},
                         {"SLURM_NODELIST", "cn[101-102]"},
                         {"SLURM_JOB_ID", "4242"},
                         {"SLURM_STEP_ID", "3"}});
  const auto e = rank_env_from_environment();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->world, 4);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->master_addr, "cn101");
  EXPECT_EQ(e->master_port, 12000 + (4242 * 7 + 3) % 20000);
  EXPECT_EQ(e->launcher, "slurm");
  {
    const Environment one({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_STEP_ID", "0"}});
    EXPECT_FALSE(rank_env_from_environment().has_value()) << "a job step of one task";
  }
  const Environment batch({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NODELIST", "a"}});
  EXPECT_FALSE(rank_env_from_environment().has_value()) << "a batch script is no rank";
}

TEST(Comm, OneRankIsTheIdentity) {
  const auto comm = single_rank_communicator();
  EXPECT_EQ(comm->world(), 1);
  EXPECT_EQ(comm->sum(int64_t{7}), 7);
  EXPECT_EQ(comm->gather_text("only"), std::vector<std::string>{"only"});
  torch::Tensor t = torch::arange(4, torch::kFloat32);
  comm->allreduce(t);
  EXPECT_TRUE(t.equal(torch::arange(4, torch::kFloat32)));
  torch::Tensor shard = torch::empty({4});
  comm->reduce_scatter(shard, t);
  EXPECT_TRUE(shard.equal(t));
}

// Rank r of two, meeting at `store`, on the CPU.
std::shared_ptr<Communicator> connect_rank_of_two(const HostedStore& store, int r) {
  RankEnv env;
  env.rank = r;
  env.world = 2;
  env.master_port = store.port();
  env.store_hosted = true;
  return connect_ranks(env, torch::kCPU, 30);
}

TEST(Comm, TwoGlooRanksReduceGatherAndExchangeText) {
  HostedStore store(2, 30);
  std::vector<std::string> failures(2);
  std::vector<std::vector<std::string>> texts(2);
  std::vector<double> sums(2);
  std::vector<torch::Tensor> reduced(2), gathered(2), scattered(2);
  std::vector<int64_t> sent(2), scatter_sent(2);
  auto rank = [&](int r) {
    try {
      const auto comm = connect_rank_of_two(store, r);
      torch::Tensor t = torch::full({1000}, static_cast<float>(r + 1));
      comm->allreduce_async(t)->wait();
      reduced[static_cast<size_t>(r)] = t;
      std::vector<torch::Tensor> out = {torch::empty({3}), torch::empty({3})};
      comm->allgather(out, torch::full({3}, static_cast<float>(10 * r)));
      gathered[static_cast<size_t>(r)] = torch::cat(out);
      sums[static_cast<size_t>(r)] = comm->sum(0.5 * (r + 1));
      // Text of other lengths and bytes of every value, NUL included.
      texts[static_cast<size_t>(r)] =
          comm->gather_text(r == 0 ? std::string("rank zero") : std::string("1\0\xff", 3));
      sent[static_cast<size_t>(r)] = comm->stats().bytes_sent;
      // Rank r gives 0, 1, ..., 5 times (r + 1): the sum is 3 x that, rank r keeps its half.
      torch::Tensor shard = torch::full({3}, -1.0f);
      comm->reduce_scatter(shard, torch::arange(6, torch::kFloat32) * (r + 1));
      scattered[static_cast<size_t>(r)] = shard;
      scatter_sent[static_cast<size_t>(r)] =
          comm->stats().bytes_sent - sent[static_cast<size_t>(r)];
    } catch (const std::exception& e) {
      failures[static_cast<size_t>(r)] = e.what();
    }
  };
  std::thread a(rank, 0), b(rank, 1);
  a.join();
  b.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(failures[static_cast<size_t>(r)], "") << "rank " << r;
    EXPECT_TRUE(reduced[static_cast<size_t>(r)].eq(3).all().item<bool>());
    EXPECT_TRUE(
        gathered[static_cast<size_t>(r)].equal(torch::tensor({0.f, 0.f, 0.f, 10.f, 10.f, 10.f})));
    EXPECT_DOUBLE_EQ(sums[static_cast<size_t>(r)], 1.5);
    EXPECT_TRUE(scattered[static_cast<size_t>(r)].equal(
        torch::arange(3 * r, 3 * r + 3, torch::kFloat32) * 3));
    // Gloo's reduce-scatter all-reduces the 24 bytes: 2(N-1)/N of them sent.
    EXPECT_EQ(scatter_sent[static_cast<size_t>(r)], 24);
    EXPECT_EQ(texts[static_cast<size_t>(r)],
              (std::vector<std::string>{"rank zero", std::string("1\0\xff", 3)}));
  }
  // The ring's volume: an all-reduce of 4000 bytes sends 4000 from each of 2 ranks, plus the
  // gather and the scalars; the same on both ranks.
  EXPECT_GE(sent[0], 4000 + 12);
  EXPECT_EQ(sent[0], sent[1]);
}

// What Gloo's reduce-scatter allocates, which fsdp's buffer tally and the estimate count: a
// copy of its input, where the all-reduce reduces in place. Both ranks run in this process,
// so their allocations add up in the tracking allocator.
TEST(Comm, GlooReduceScatterCopiesItsInputAndTheAllReduceDoesNot) {
  CpuMemoryTracker& tracker = CpuMemoryTracker::install();
  const int64_t n = 1 << 20;  // 4 MiB a rank
  const int64_t bytes = n * static_cast<int64_t>(sizeof(float));
  for (const bool scatter : {false, true}) {
    HostedStore store(2, 30);
    std::vector<torch::Tensor> in = {torch::ones({n}), torch::ones({n})};
    std::vector<torch::Tensor> out = {torch::empty({n / 2}), torch::empty({n / 2})};
    std::vector<std::string> failures(2);
    const int64_t before = tracker.current_bytes();
    tracker.reset_peak();
    auto rank = [&](int r) {
      try {
        const auto comm = connect_rank_of_two(store, r);
        const size_t i = static_cast<size_t>(r);
        if (scatter)
          comm->reduce_scatter(out[i], in[i]);
        else
          comm->allreduce(in[i]);
      } catch (const std::exception& e) {
        failures[static_cast<size_t>(r)] = e.what();
      }
    };
    std::thread a(rank, 0), b(rank, 1);
    a.join();
    b.join();
    ASSERT_EQ(failures[0] + failures[1], "");
    const int64_t added = tracker.peak_bytes() - before;
    if (scatter) {
      EXPECT_TRUE(out[0].eq(2).all().item<bool>() && out[1].eq(2).all().item<bool>());
      // Each rank's copy lives until its collective ends, which needs the other rank's to
      // have begun: both copies are alive at once.
      EXPECT_GE(added, 2 * bytes) << "a copy of the input on each rank";
    } else {
      EXPECT_TRUE(in[0].eq(2).all().item<bool>());
      EXPECT_LT(added, bytes / 4) << "in place";
    }
  }
}

TEST(Comm, ARankThatNeverComesIsATimeoutNotAHang) {
  HostedStore store(2, 2);
  RankEnv env;
  env.rank = 0;
  env.world = 2;
  env.master_port = store.port();
  env.store_hosted = true;
  try {
    connect_ranks(env, torch::kCPU, 2);
    ADD_FAILURE() << "met a rank that was never started";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRuntime) << e.what();
  }
}

}  // namespace
}  // namespace gradscope
