// Ranks from a launcher's environment, and collectives on c10d's process groups: Gloo on the
// CPU, NCCL on CUDA (in a build against a CUDA LibTorch).
#include "gradscope/comm/comm.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/log.h"
#include "gradscope/core/plain_text.h"
#include "gradscope/comm/roll_call.h"

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
  SingleRank() : Communicator(0, 1) { rank_hosts_ = {this_host_name()}; }
  std::unique_ptr<PendingCollective> allreduce_async(const torch::Tensor&) override {
    ++stats_.collectives;
    return std::make_unique<Done>();
  }
  void allgather(std::vector<torch::Tensor>& out, const torch::Tensor& in) override {
    ++stats_.collectives;
    out.at(0).copy_(in);
  }
  void broadcast(const torch::Tensor&, int) override { ++stats_.collectives; }
  void reduce_scatter(const torch::Tensor& out, const torch::Tensor& in) override {
    ++stats_.collectives;
    out.copy_(in.view_as(out));
  }
};

using Seconds = std::chrono::duration<double>;
using Clock = std::chrono::steady_clock;

// A meeting's id: random, and apart for every meeting of this process.
uint64_t meeting_nonce() {
  static std::atomic<uint64_t> count{0};
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32 ^ device()) + count++;
}
std::chrono::milliseconds millis(double s) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Seconds(s));
}

// A c10d backend (Gloo or NCCL) behind the Communicator: only Backend's virtual collectives.
class C10dRanks : public Communicator {
 public:
  C10dRanks(const RankEnv& env, const torch::Device& device,
            c10::intrusive_ptr<c10d::Backend> group, double timeout_s)
      : Communicator(env.rank, env.world, device),
        group_(std::move(group)),
        env_(env),
        timeout_s_(timeout_s) {}

  // Once the ranks have told each other their hosts: ranks on several hosts take a roll call
  // when a collective fails, and their collectives leave it its window within the timeout.
  void met(std::vector<std::string> rank_hosts, std::string ifname) {
    // What a peer says is data: a plain name of at most 64 characters.
    for (std::string& h : rank_hosts) h = h.empty() ? "unnamed-host" : plain_name_from(h, 64);
    rank_hosts_ = std::move(rank_hosts);
    ifname_ = std::move(ifname);
    if (host_count() <= 1) return;
    // Collectives leave four windows of --dist-timeout: two for the roll call to find a
    // stopped beat, two to record the failure and end on a busy machine.
    const double window = roll_call_window_s(timeout_s_);
    const double blocked = std::max(1.0, timeout_s_ - 4 * window);
    if (timeout_s_ < 5 * window)
      log_warn("--dist-timeout {} is short for ranks on several hosts: a lost host is named "
               "after up to {:.0f} s",
               timeout_s_, blocked + 4 * window);
    group_->setTimeout(millis(blocked));
    // The meeting's id, rank 0's: a store that outlives a meeting keeps the keys of another.
    const std::string meeting =
        gather_text(rank_ == 0 ? fmt::format("{:016x}", meeting_nonce()) : "").at(0);
    roll_call_ = std::make_unique<RollCall>(env_, meeting, rank_hosts_, window, blocked);
  }

  void failed_here() override {
    if (roll_call_) roll_call_->failed_here();
  }

  std::unique_ptr<PendingCollective> allreduce_async(const torch::Tensor& t) override {
    count_allreduce(static_cast<int64_t>(t.numel() * t.element_size()));
    // NCCL reduces device tensors only: a CPU tensor (the trainer's stop flags, an
    // evaluation's sums) goes there and back, synchronously.
    const bool staged = t.device() != device_;
    std::vector<at::Tensor> tensors{staged ? t.to(device_) : t};
    const Clock::time_point started = Clock::now();
    try {
      auto pending = std::make_unique<Pending>(this, group_->allreduce(tensors), started);
      if (!staged) return pending;
      pending->wait();
      t.copy_(tensors[0]);
      return std::make_unique<Done>();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      lost("all-reduce", e, started);
    }
  }
  void allgather(std::vector<torch::Tensor>& out, const torch::Tensor& in) override {
    count_allgather(static_cast<int64_t>(in.numel() * in.element_size()));
    std::vector<std::vector<at::Tensor>> outputs{out};
    std::vector<at::Tensor> inputs{in};
    const Clock::time_point started = Clock::now();
    try {
      finish_counted(group_->allgather(outputs, inputs));
    } catch (const std::exception& e) {
      lost("all-gather", e, started);
    }
  }
  void broadcast(const torch::Tensor& t, int root) override {
    count_broadcast(static_cast<int64_t>(t.numel() * t.element_size()), root);
    std::vector<at::Tensor> tensors{t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    const Clock::time_point started = Clock::now();
    try {
      finish_counted(group_->broadcast(tensors, o));
    } catch (const std::exception& e) {
      lost("broadcast", e, started);
    }
  }
  void reduce_scatter(const torch::Tensor& out, const torch::Tensor& in) override {
    // Checked here: Gloo's own checks end the process rather than throw.
    TORCH_CHECK(in.dim() == 1 && out.dim() == 1 && in.numel() == out.numel() * world_ &&
                    in.scalar_type() == out.scalar_type() && in.is_contiguous() &&
                    out.is_contiguous(),
                "reduce_scatter: a flat input of world x the output's elements, of the output's "
                "dtype, expected");
    // Gloo's _reduce_scatter_base all-reduces a copy of the input and copies the chunk out
    // (c10d's ProcessGroupGloo; tests/comm/comm_test.cpp measures the copy); NCCL runs a
    // reduce-scatter.
    count_reduce_scatter(static_cast<int64_t>(in.numel() * in.element_size()),
                         reduce_scatter_copies_input(device_, world_));
    at::Tensor input = in.device() == device_ ? in : in.to(device_);
    at::Tensor output = out.device() == device_ ? out : torch::empty_like(out, input.options());
    const Clock::time_point started = Clock::now();
    try {
      finish_counted(group_->_reduce_scatter_base(output, input));
    } catch (const std::exception& e) {
      lost("reduce-scatter", e, started);
    }
    if (!output.is_same(out)) out.copy_(output);
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
  // finish(), its time counted as waiting.
  void finish_counted(const Work& work) {
    const auto t0 = std::chrono::steady_clock::now();
    finish(work, device_);
    stats_.wait_s += Seconds(std::chrono::steady_clock::now() - t0).count();
  }
  // Waited for while its communicator lives (the strategies wait before they let go of it).
  struct Pending : PendingCollective {
    Pending(C10dRanks* o, Work w, Clock::time_point t) : owner(o), work(std::move(w)), started(t) {}
    void wait() override {
      try {
        owner->finish_counted(work);
      } catch (const std::exception& e) {
        owner->lost("all-reduce", e, started);
      }
    }
    bool done() override { return work->isCompleted(); }
    C10dRanks* owner;
    Work work;
    Clock::time_point started;  // when the collective was launched
  };

  // A failed collective's error; across hosts, with what the roll call found.
  [[noreturn]] void lost(const std::string& what, const std::exception& e,
                         Clock::time_point started) {
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    if (why.size() > 300) why = why.substr(0, 300) + "...";
    std::string lost_host;
    if (roll_call_ && !called_) {
      called_ = true;  // once: a later failure of this rank says only its own
      lost_host = "; " + roll_call_->take(Seconds(Clock::now() - started).count());
    }
    throw PeerLost(fmt::format("rank {}: {} failed{}: {}", rank_, what, lost_host, why),
                   "another rank stopped (its error is in its own output), or did not answer "
                   "within --dist-timeout");
  }

  c10::intrusive_ptr<c10d::Backend> group_;
  RankEnv env_;
  double timeout_s_;
  std::unique_ptr<RollCall> roll_call_;  // ranks on several hosts
  bool called_ = false;                  // a roll call was taken
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
  if (const char* ifname = env_text("GLOO_SOCKET_IFNAME")) {
    check_usage(is_plain_name(ifname, 15),
                "environment variable GLOO_SOCKET_IFNAME is no network interface name",
                "set it to an interface `ip link` lists (eth0, ib0), or unset it");
    env.ifname = ifname;
  }
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
void Communicator::count_reduce_scatter(int64_t in_bytes, bool by_allreduce) {
  if (by_allreduce) return count_allreduce(in_bytes);
  ++stats_.collectives;
  stats_.bytes_sent += (world_ - 1) * in_bytes / world_;
}

std::shared_ptr<Communicator> single_rank_communicator() { return std::make_shared<SingleRank>(); }

bool reduce_scatter_copies_input(const torch::Device& device, int64_t world) {
  return world > 1 && !device.is_cuda();
}

int Communicator::host_count() const {
  std::vector<std::string> hosts = rank_hosts_;
  std::sort(hosts.begin(), hosts.end());
  return std::max<int>(1, static_cast<int>(std::unique(hosts.begin(), hosts.end()) -
                                           hosts.begin()));
}

std::string this_host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == 0) return "unnamed-host";
  return plain_name_from(name, 64);
}

std::string hosts_of_ranks(const std::vector<std::string>& rank_hosts,
                           const std::vector<int>& ranks) {
  std::map<std::string, std::vector<int>> by_host;
  std::vector<std::string> order;
  for (int r : ranks) {
    const std::string host = r >= 0 && r < static_cast<int>(rank_hosts.size())
                                 ? rank_hosts[static_cast<size_t>(r)]
                                 : "an unknown host";
    if (!by_host.count(host)) order.push_back(host);
    by_host[host].push_back(r);
  }
  std::string out;
  for (const std::string& host : order) {
    const std::vector<int>& rs = by_host[host];
    std::string list;
    for (int r : rs) list += (list.empty() ? "" : ", ") + std::to_string(r);
    out += fmt::format("{}host {} (rank{} {})", out.empty() ? "" : ", ", host,
                       rs.size() > 1 ? "s" : "", list);
  }
  return out;
}

double roll_call_window_s(double timeout_s) {
  return std::clamp(kRollCallShare * timeout_s, 1.0, kRollCallMaxS);
}

LinkProbe Communicator::probe_link(int64_t min_bytes, int64_t max_bytes, int repeats) {
  const CommStats before = stats_;  // the probe is no part of the run's traffic
  LinkProbe p;
  p.repeats = repeats;
  // Every rank starts together (a small sum first) and the slowest rank's time counts: the
  // all-reduce is done when it is done on every rank. All ranks go on by that time, so they
  // agree on each size.
  const auto timed = [&](int64_t bytes) {
    torch::Tensor t = torch::ones({bytes / 4}, torch::kFloat32).to(device_);
    sum(int64_t{0});
    const auto t0 = std::chrono::steady_clock::now();
    allreduce(t);
    const double s = Seconds(std::chrono::steady_clock::now() - t0).count();
    double slowest = 0;
    for (const std::string& text : gather_text(fmt::format("{:.9e}", s)))
      slowest = std::max(slowest, std::strtod(text.c_str(), nullptr));
    return slowest;
  };
  int64_t bytes = min_bytes;
  timed(bytes);  // the connections' first use
  while (bytes < max_bytes && timed(bytes) < 0.1) bytes *= 4;
  p.bytes = std::min(bytes, max_bytes);
  p.best_s = std::numeric_limits<double>::infinity();
  for (int i = 0; i < repeats; ++i) p.best_s = std::min(p.best_s, timed(p.bytes));
  p.bus_bytes_per_s = 2.0 * (world_ - 1) / world_ * static_cast<double>(p.bytes) / p.best_s;
  stats_ = before;
  return p;
}

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
            ? "the port may be in use (set another MASTER_PORT; gradscope run --nproc picks a "
              "free one itself), or MASTER_ADDR may not be an address of this host (under "
              "Slurm, set MASTER_ADDR where node names do not resolve)"
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
      auto ranks = std::make_shared<C10dRanks>(env, device, std::move(group), timeout_s);
      ranks->met(ranks->gather_text(this_host_name()), env.ifname);
      return ranks;
    } catch (const std::exception& e) {
      fail_collective(env.rank, "meeting the other ranks (NCCL)", e);
    }
  }
#endif
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->timeout = millis(timeout_s);
  std::shared_ptr<C10dRanks> ranks;
  try {
    if (!env.ifname.empty())
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(env.ifname));
    else if (env.master_addr == "127.0.0.1" || env.master_addr == "localhost")
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    else
      options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    auto group =
        c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, env.rank, env.world, options);
    ranks = std::make_shared<C10dRanks>(env, torch::Device(torch::kCPU), std::move(group),
                                        timeout_s);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail_collective(env.rank, "meeting the other ranks", e);
  }
  ranks->met(ranks->gather_text(this_host_name()), env.ifname);
  return ranks;
}

struct HostedStore::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

namespace {

// A TCP socket bound to `address`:`port` (not yet listening), for the store to take over: so
// that the meeting point listens on that address alone, not on every interface of the host.
int bound_socket(const std::string& address, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(address.c_str(), service.c_str(), &hints, &found);
  check_usage(rc == 0 && found,
              fmt::format("cannot resolve --master-addr '{}': {}", address, gai_strerror(rc)),
              "pass an address of node 0 (an IP address, or a name every host resolves)");
  std::string why;
  int fd = -1;
  for (addrinfo* a = found; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      why = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  check_usage(fd >= 0,
              fmt::format("the meeting point cannot listen on {}:{}: {}", address, port, why),
              "on node 0, --master-addr must be an address of this host and --master-port a "
              "free port");
  return fd;
}

}  // namespace

HostedStore::HostedStore(int world, double timeout_s, const std::string& address, int port)
    : impl_(std::make_unique<Impl>()) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(port);
  o.isServer = true;
  o.numWorkers = world;
  o.waitWorkers = false;
  o.timeout = millis(timeout_s);
  const int fd = bound_socket(address, port);
  o.masterListenFd = fd;  // the store listens on it and closes it (even when it fails)
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>(address, o);
  } catch (const std::exception& e) {
    std::string why = e.what();
    fail_runtime("cannot host the ranks' meeting point: " + why.substr(0, why.find('\n')),
                 "the system refused a TCP port on " + address);
  }
  port_ = impl_->store->getPort();
}


HostedStore::~HostedStore() = default;

}  // namespace gradscope
