// Ranks from a launcher's environment, and collectives on c10d's process groups: Gloo on the
// CPU, NCCL on CUDA (in a build against a CUDA LibTorch).
#include "gradscope/comm/comm.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace gradscope {
namespace {

const char* env_text(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int env_int(const char* name, int min, int max) {
  const std::string hint =
      "the launcher (gradscope run --nproc, torchrun or srun) sets it; unset it to run one "
      "process";
  const std::optional<int64_t> x = env_integer(name, min, max, hint);
  check_usage(x.has_value(), fmt::format("environment variable {} is not set", name), hint);
  return static_cast<int>(*x);
}

// A rank's error from a collective or the meeting, with what usually causes it.
[[noreturn]] void fail_collective(int rank, const std::string& what, const std::exception& e) {
  std::string why = e.what();
  why = why.substr(0, why.find('\n'));
  if (why.size() > 300) why = why.substr(0, 300) + "...";
  throw PeerLost(fmt::format("rank {}: {} failed: {}", rank, what, why),
                 "another rank stopped (its error is in its own output), or did not answer "
                 "within --dist-timeout");
}

// A collective that finished before it was handed back.
struct Done : PendingCollective {
  void wait() override {}
  bool done() override { return true; }
};

class SingleRank : public Communicator {
 public:
  SingleRank() : Communicator(0, 1) {}
  std::unique_ptr<PendingCollective> allreduce_async(const torch::Tensor&) override {
    ++stats_.collectives;
    return std::make_unique<Done>();
  }
  void allgather(std::vector<torch::Tensor>& out, const torch::Tensor& in) override {
    ++stats_.collectives;
    out.at(0).copy_(in);
  }
  void broadcast(const torch::Tensor&, int) override { ++stats_.collectives; }
};

using Seconds = std::chrono::duration<double>;
std::chrono::milliseconds millis(double s) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Seconds(s));
}

// A c10d backend (Gloo or NCCL) behind the Communicator: only Backend's virtual collectives.
class C10dRanks : public Communicator {
 public:
  C10dRanks(int rank, int world, const torch::Device& device,
            c10::intrusive_ptr<c10d::Backend> group)
      : Communicator(rank, world, device), group_(std::move(group)) {}

  std::unique_ptr<PendingCollective> allreduce_async(const torch::Tensor& t) override {
    count_allreduce(static_cast<int64_t>(t.numel() * t.element_size()));
    // NCCL reduces device tensors only: a CPU tensor (the trainer's stop flags, an
    // evaluation's sums) goes there and back, synchronously.
    const bool staged = t.device() != device_;
    std::vector<at::Tensor> tensors{staged ? t.to(device_) : t};
    try {
      auto pending = std::make_unique<Pending>(rank_, device_, group_->allreduce(tensors));
      if (!staged) return pending;
      pending->wait();
      t.copy_(tensors[0]);
      return std::make_unique<Done>();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      fail_collective(rank_, "all-reduce", e);
    }
  }
  void allgather(std::vector<torch::Tensor>& out, const torch::Tensor& in) override {
    count_allgather(static_cast<int64_t>(in.numel() * in.element_size()));
    std::vector<std::vector<at::Tensor>> outputs{out};
    std::vector<at::Tensor> inputs{in};
    try {
      finish(group_->allgather(outputs, inputs), device_);
    } catch (const std::exception& e) {
      fail_collective(rank_, "all-gather", e);
    }
  }
  void broadcast(const torch::Tensor& t, int root) override {
    count_broadcast(static_cast<int64_t>(t.numel() * t.element_size()), root);
    std::vector<at::Tensor> tensors{t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    try {
      finish(group_->broadcast(tensors, o), device_);
    } catch (const std::exception& e) {
      fail_collective(rank_, "broadcast", e);
    }
  }

 private:
  using Work = c10::intrusive_ptr<c10d::Work>;
  // NCCL's wait only orders the current CUDA stream after the collective: the device is
  // synchronized too, so that the host's clock sees the collective's end (and the kernels
  // queued before the wait, which a CUDA step's phase boundaries synchronize anyway).
  static void finish(const Work& work, const torch::Device& device) {
    work->wait();
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
  }
  struct Pending : PendingCollective {
    Pending(int r, const torch::Device& d, Work w) : rank(r), device(d), work(std::move(w)) {}
    void wait() override {
      try {
        finish(work, device);
      } catch (const std::exception& e) {
        fail_collective(rank, "all-reduce", e);
      }
    }
    bool done() override { return work->isCompleted(); }
    int rank;
    torch::Device device;
    Work work;
  };
  c10::intrusive_ptr<c10d::Backend> group_;
};

}  // namespace

std::optional<RankEnv> rank_env_from_environment() {
  RankEnv env;
  if (env_text("WORLD_SIZE") && env_text("RANK")) {
    env.world = env_int("WORLD_SIZE", 1, 1 << 20);
    env.rank = env_int("RANK", 0, env.world - 1);
    env.local_rank = env_text("LOCAL_RANK") ? env_int("LOCAL_RANK", 0, env.world - 1) : 0;
    if (const char* a = env_text("MASTER_ADDR")) env.master_addr = a;
    check_usage(env_text("MASTER_PORT") != nullptr || env.world == 1,
                "RANK and WORLD_SIZE are set but MASTER_PORT is not",
                "set MASTER_ADDR and MASTER_PORT as torchrun does, or start the ranks with "
                "gradscope run --nproc N");
    if (env.world > 1) env.master_port = env_int("MASTER_PORT", 1, 65535);
    env.launcher = "torchrun";
    if (const char* l = env_text(kLauncherVariable); l && std::strcmp(l, "gradscope") == 0) {
      env.launcher = "gradscope";
      env.store_hosted = true;
    }
    // torchrun's agent already hosts a store at MASTER_PORT: every rank is its client.
    if (const char* a = env_text("TORCHELASTIC_USE_AGENT_STORE");
        a &&
        (std::strcmp(a, "True") == 0 || std::strcmp(a, "true") == 0 || std::strcmp(a, "1") == 0))
      env.store_hosted = true;
  } else if (env_text("SLURM_NTASKS") && env_text("SLURM_PROCID") && env_text("SLURM_STEP_ID")) {
    // A job step that srun started (a batch script itself has SLURM_NTASKS but is no rank).
    env.world = env_int("SLURM_NTASKS", 1, 1 << 20);
    env.rank = env_int("SLURM_PROCID", 0, env.world - 1);
    env.local_rank = env_text("SLURM_LOCALID") ? env_int("SLURM_LOCALID", 0, env.world - 1) : 0;
    env.launcher = "slurm";
    if (env.world > 1) {
      if (const char* a = env_text("MASTER_ADDR")) {
        env.master_addr = a;
      } else {
        const char* nodes = env_text("SLURM_STEP_NODELIST");
        if (!nodes) nodes = env_text("SLURM_NODELIST");
        check_usage(nodes != nullptr, "SLURM_NTASKS is above 1 but SLURM_NODELIST is not set",
                    "start the ranks with srun, which sets it, or set MASTER_ADDR");
        env.master_addr = first_slurm_host(nodes);
      }
      // A port of the job's own: Slurm's job ids differ between concurrent jobs.
      if (env_text("MASTER_PORT")) {
        env.master_port = env_int("MASTER_PORT", 1, 65535);
      } else {
        // Below Linux's ephemeral ports, and apart for each step of each job.
        // Slurm's job and step ids are 32-bit unsigned numbers; anything else is no id of
        // Slurm's (and would overflow the sum below).
        const std::string hint =
            "srun sets it to Slurm's job (step) id; set MASTER_PORT to choose the port instead";
        const int64_t id = env_integer("SLURM_JOB_ID", 0, 4294967295LL, hint).value_or(0);
        const int64_t st = env_integer("SLURM_STEP_ID", 0, 4294967295LL, hint).value_or(0);
        env.master_port = 12000 + static_cast<int>((id * 7 + st) % 20000);
      }
    }
  } else {
    return std::nullopt;
  }
  if (env.world <= 1) return std::nullopt;
  return env;
}

std::string first_slurm_host(const std::string& nodelist) {
  // The first entry: up to a comma outside brackets.
  std::string first;
  int depth = 0;
  for (char ch : nodelist) {
    if (ch == '[') ++depth;
    if (ch == ']') --depth;
    if (ch == ',' && depth == 0) break;
    first += ch;
  }
  const auto valid = [](const std::string& s) {
    if (s.empty() || s.size() > 255) return false;
    for (char ch : s)
      if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '.' || ch == '_'))
        return false;
    return true;
  };
  const auto open = first.find('[');
  std::string host = first;
  if (open != std::string::npos) {
    const auto close = first.find(']', open);
    check_usage(close != std::string::npos,
                "cannot read Slurm node list '" + nodelist.substr(0, 80) + "': unclosed '['",
                "set MASTER_ADDR to the first rank's host");
    std::string range = first.substr(open + 1, close - open - 1);
    range = range.substr(0, range.find_first_of(",-"));
    host = first.substr(0, open) + range + first.substr(close + 1);
  }
  check_usage(valid(host), "cannot read Slurm node list '" + nodelist.substr(0, 80) + "'",
              "set MASTER_ADDR to the first rank's host");
  return host;
}

int64_t Communicator::sum(int64_t v) {
  torch::Tensor t = torch::tensor({v}, torch::kInt64).to(device_);
  allreduce(t);
  return t.item<int64_t>();
}

double Communicator::sum(double v) {
  torch::Tensor t = torch::tensor({v}, torch::kFloat64).to(device_);
  allreduce(t);
  return t.item<double>();
}

std::vector<std::string> Communicator::gather_text(const std::string& text) {
  const int64_t longest =
      [&] {
        torch::Tensor n = torch::zeros({world_}, torch::kInt64);
        n[rank_] = static_cast<int64_t>(text.size());
        n = n.to(device_);
        allreduce(n);
        return n;
      }()
          .max()
          .item<int64_t>();
  torch::Tensor mine = torch::zeros({longest + 8}, torch::kUInt8);
  const int64_t size = static_cast<int64_t>(text.size());
  std::memcpy(mine.data_ptr<uint8_t>(), &size, 8);
  if (size > 0) std::memcpy(mine.data_ptr<uint8_t>() + 8, text.data(), text.size());
  mine = mine.to(device_);
  std::vector<torch::Tensor> all;
  for (int r = 0; r < world_; ++r) all.push_back(torch::empty_like(mine));
  allgather(all, mine);
  std::vector<std::string> out;
  for (torch::Tensor t : all) {
    t = t.cpu();
    int64_t n = 0;
    std::memcpy(&n, t.data_ptr<uint8_t>(), 8);
    out.emplace_back(reinterpret_cast<const char*>(t.data_ptr<uint8_t>()) + 8,
                     static_cast<size_t>(n));
  }
  return out;
}

void Communicator::count_allreduce(int64_t bytes) {
  ++stats_.collectives;
  stats_.bytes_sent += 2 * (world_ - 1) * bytes / world_;
}
void Communicator::count_allgather(int64_t bytes) {
  ++stats_.collectives;
  stats_.bytes_sent += (world_ - 1) * bytes;
}
void Communicator::count_broadcast(int64_t bytes, int root) {
  ++stats_.collectives;
  if (rank_ == root) stats_.bytes_sent += (world_ - 1) * bytes;
}

std::shared_ptr<Communicator> single_rank_communicator() { return std::make_shared<SingleRank>(); }

std::shared_ptr<Communicator> connect_ranks(const RankEnv& env, const torch::Device& device,
                                            double timeout_s) {
#ifndef USE_C10D_NCCL
  check_usage(device.is_cpu(),
              "several ranks on " + device.str() +
                  " need NCCL, which this build (against a CPU LibTorch) lacks",
              "train with --device cpu, or build with `make check-cuda` (a CUDA LibTorch)");
#endif
  c10::intrusive_ptr<c10d::Store> store;
  try {
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(env.master_port);
    o.isServer = env.rank == 0 && !env.store_hosted;
    o.numWorkers = env.world;
    o.waitWorkers = false;
    o.timeout = millis(timeout_s);
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, o);
  } catch (const std::exception& e) {
    std::string why = e.what();
    fail_runtime(
        fmt::format("rank {}: cannot meet the other ranks at {}:{}: {}", env.rank, env.master_addr,
                    env.master_port, why.substr(0, why.find('\n'))),
        env.rank == 0 && !env.store_hosted
            ? "the port may be in use: set another MASTER_PORT (gradscope run --nproc picks a "
              "free one itself)"
            : "check MASTER_ADDR and MASTER_PORT, and that rank 0 started");
  }
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("gradscope", store);
#ifdef USE_C10D_NCCL
  if (device.is_cuda()) {
    try {
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = millis(timeout_s);
      auto group =
          c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, env.rank, env.world, options);
      return std::make_shared<C10dRanks>(env.rank, env.world, device, std::move(group));
    } catch (const std::exception& e) {
      fail_collective(env.rank, "meeting the other ranks (NCCL)", e);
    }
  }
#endif
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->timeout = millis(timeout_s);
  try {
    if (const char* ifname = env_text("GLOO_SOCKET_IFNAME"))
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    else if (env.master_addr == "127.0.0.1" || env.master_addr == "localhost")
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    else
      options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    auto group =
        c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, env.rank, env.world, options);
    return std::make_shared<C10dRanks>(env.rank, env.world, torch::Device(torch::kCPU),
                                       std::move(group));
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail_collective(env.rank, "meeting the other ranks", e);
  }
}

struct HostedStore::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

HostedStore::HostedStore(int world, double timeout_s) : impl_(std::make_unique<Impl>()) {
  c10d::TCPStoreOptions o;
  o.port = 0;  // the system picks a free one
  o.isServer = true;
  o.numWorkers = world;
  o.waitWorkers = false;
  o.timeout = millis(timeout_s);
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
  } catch (const std::exception& e) {
    std::string why = e.what();
    fail_runtime("cannot host the ranks' meeting point: " + why.substr(0, why.find('\n')),
                 "the system refused a local TCP port");
  }
  port_ = impl_->store->getPort();
}


HostedStore::~HostedStore() = default;

}  // namespace gradscope
