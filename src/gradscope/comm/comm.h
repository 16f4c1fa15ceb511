// The ranks of a run and the collectives between them, on LibTorch's own c10d: Gloo on the
// CPU. Nothing here is a transport of gradscope's own; this folder only wraps c10d's
// ProcessGroupGloo and TCPStore in the few collectives the sharded steps use, and keeps the
// figures the record needs (bytes sent, and how much of what was reduced had finished before
// its caller waited).
//
// Where a run's ranks come from (rank_env_from_environment): gradscope run --nproc N starts N
// copies of itself with torchrun's variables set; torchrun sets them itself; Slurm's srun sets
// its own (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODELIST). Ranks meet through a
// TCPStore at MASTER_ADDR:MASTER_PORT (the first host of the node list under Slurm).
//
// On the CPU the ranks use c10d's Gloo process group (the one linked into LibTorch); on CUDA,
// in a build against a CUDA LibTorch, its NCCL process group.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "gradscope/core/error.h"

namespace gradscope {

// A collective or the meeting that failed: another rank died or did not answer in time. The
// trainer records the run as crashed.
class PeerLost : public Error {
 public:
  PeerLost(const std::string& what, std::string hint)
      : Error(ErrorKind::kRuntime, what, std::move(hint)) {}
};

// This process's place among the ranks of a run.
struct RankEnv {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string launcher;       // "gradscope", "torchrun" or "slurm"
  bool store_hosted = false;  // the launcher hosts the store: rank 0 connects as a client too
  // The network interface the ranks reach each other on (GLOO_SOCKET_IFNAME, or --ifname);
  // "" = the address the host name resolves to (127.0.0.1 when the ranks meet there).
  std::string ifname;
};

// The environment variables gradscope run --nproc sets in each rank it starts (beside
// torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT).
constexpr const char* kLauncherVariable = "GRADSCOPE_RANK_LAUNCHER";
// Set for rank 0 alone: a file to create once the run's record is written.
constexpr const char* kRecordMarkerVariable = "GRADSCOPE_RECORD_MARKER";

// The rank this process is, from its launcher's variables; nullopt when none says there is
// more than one rank (a plain process, or a Slurm job step of one task). A usage error names a
// variable that is set but unreadable.
std::optional<RankEnv> rank_env_from_environment();

// The first host of a Slurm node list: "node[03-05,9],gpu1" -> "node03". A usage error for
// text that is not a node list.
std::string first_slurm_host(const std::string& nodelist);

// A collective started and not yet waited for.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual void wait() = 0;
  // Whether it has finished, without waiting.
  virtual bool done() = 0;
};

// What a communicator has done, for the record.
struct CommStats {
  int64_t collectives = 0;
  // What this rank sends under the ring algorithms: an all-reduce of n bytes sends
  // 2(N-1)/N n, an all-gather of n bytes per rank (N-1) n, a broadcast (N-1) n from its root,
  // a reduce-scatter of n bytes (N-1)/N n on NCCL and, on Gloo, which all-reduces them,
  // 2(N-1)/N n.
  int64_t bytes_sent = 0;
  // Seconds this rank's thread spent blocked on collectives: waiting for an all-reduce it
  // started, or in a synchronous one (the communication the step could not hide).
  double wait_s = 0;

  CommStats& operator+=(const CommStats& o) {
    collectives += o.collectives;
    bytes_sent += o.bytes_sent;
    wait_s += o.wait_s;
    return *this;
  }
  friend CommStats operator-(CommStats a, const CommStats& b) {
    a.collectives -= b.collectives;
    a.bytes_sent -= b.bytes_sent;
    a.wait_s -= b.wait_s;
    return a;
  }
};

// The link between the hosts, measured (Communicator::probe_link). bus_bytes_per_s is what a
// link must carry per second for the fastest time: the ring algorithm's 2(N-1)/N of the
// buffer over it (NCCL's "bus bandwidth").
struct LinkProbe {
  int64_t bytes = 0;    // the buffer all-reduced
  int repeats = 0;
  double best_s = 0;    // the fastest of the repeats
  double bus_bytes_per_s = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  int rank() const { return rank_; }
  int world() const { return world_; }

  // Sums `t` over the ranks, in place; the tensor must stay alive until waited for.
  virtual std::unique_ptr<PendingCollective> allreduce_async(const torch::Tensor& t) = 0;
  void allreduce(const torch::Tensor& t) { allreduce_async(t)->wait(); }
  // out[r] = rank r's `in` (out holds world() tensors shaped as `in`).
  virtual void allgather(std::vector<torch::Tensor>& out, const torch::Tensor& in) = 0;
  // Rank `root`'s `t` to every rank, in place.
  virtual void broadcast(const torch::Tensor& t, int root) = 0;
  // `in` (world() x out.numel() elements, flat, contiguous, of out's dtype) summed over the
  // ranks; chunk rank() of the sum written to `out`. c10d's reduce_scatter_tensor: on Gloo an
  // all-reduce of a copy of `in` (a second buffer of its size while it runs) and a copy of
  // the chunk, counted as the all-reduce; on NCCL a ring reduce-scatter.
  virtual void reduce_scatter(const torch::Tensor& out, const torch::Tensor& in) = 0;

  // Scalars summed over the ranks.
  int64_t sum(int64_t v);
  double sum(double v);
  // Every rank's text, in rank order (rank 0 gathers the others' figures for the record).
  std::vector<std::string> gather_text(const std::string& text);

  const CommStats& stats() const { return stats_; }

  // Each rank's host name, in rank order, as the ranks told each other when they met (one
  // entry, this host's, for a single rank).
  const std::vector<std::string>& rank_hosts() const { return rank_hosts_; }
  // Distinct hosts among the ranks.
  int host_count() const;
  // The network interface the ranks use ("" when chosen by the host name).
  const std::string& interface_name() const { return ifname_; }

  // This rank fails on its own (an error, out of memory): across hosts, the others' roll call
  // then counts it as failed, not lost. Called before the rank stops.
  virtual void failed_here() {}

  // The link between the ranks, measured: all-reduces of one buffer (each after a small sum
  // that starts the ranks together, timed by the slowest rank), from min_bytes growing 4-fold
  // while one takes under 0.1 s (up to max_bytes), then the best of `repeats`. Every rank
  // must call it at once. Its traffic is left out of stats().
  LinkProbe probe_link(int64_t min_bytes, int64_t max_bytes, int repeats);

  // Where the collectives' tensors live (NCCL takes CUDA tensors only): sum and gather_text
  // make theirs there.
  const torch::Device& device() const { return device_; }

 protected:
  Communicator(int rank, int world, torch::Device device = torch::kCPU)
      : rank_(rank), world_(world), device_(device) {}
  void count_allreduce(int64_t bytes);
  void count_allgather(int64_t bytes);
  void count_broadcast(int64_t bytes, int root);
  // `in_bytes` reduce-scattered: by a ring reduce-scatter, or by an all-reduce (Gloo).
  void count_reduce_scatter(int64_t in_bytes, bool by_allreduce);

  int rank_, world_;
  torch::Device device_;
  CommStats stats_;
  std::vector<std::string> rank_hosts_;
  std::string ifname_;
};

// Whether c10d's reduce-scatter among `world` ranks on `device` all-reduces a copy of its input
// (Gloo, the CPU's process group: the copy is a second buffer of the input's size while it
// runs, and the bytes sent are an all-reduce's) rather than running a ring reduce-scatter
// (NCCL). One rank has no transport and copies nothing.
bool reduce_scatter_copies_input(const torch::Device& device, int64_t world);

// This host's name (gethostname), cut to a plain name: what the ranks tell each other.
std::string this_host_name();

// "gs-host2 (ranks 2, 3)": the hosts of `ranks`, each with its ranks, for messages.
std::string hosts_of_ranks(const std::vector<std::string>& rank_hosts,
                           const std::vector<int>& ranks);

// One rank alone: every collective is the identity. Sharded runs of one rank use it, so that
// --nproc 1 with --shard measures the same code without a transport.
std::shared_ptr<Communicator> single_rank_communicator();

// Meets the other ranks (TCPStore at env.master_addr:master_port, rank 0 hosting it unless the
// launcher does) and builds the process group: Gloo on the CPU, NCCL on CUDA (a usage error in
// a build without CUDA); then the ranks tell each other their hosts. A collective or the
// meeting that waits longer than timeout_s fails with a PeerLost error, as does one whose peer
// died (its connection closes). On CUDA, waiting for a collective waits for the device to
// finish it and whatever was queued before it; a CPU tensor handed to a CUDA communicator is
// reduced on the device and copied back.
//
// Ranks on several hosts: each beats at the meeting point, and a failed collective first
// takes a roll call there (roll_call.h; its window is kRollCallShare of timeout_s, 1 to
// kRollCallMaxS s); its error names the hosts whose ranks' beats stopped, the ranks that
// failed on their own, or node 0 when the meeting point cannot be reached. Their collectives
// wait timeout_s less four windows (two to find a stopped beat, two to write down the
// failure and end), so that every rank ends within timeout_s.
std::shared_ptr<Communicator> connect_ranks(const RankEnv& env, const torch::Device& device,
                                            double timeout_s);

constexpr double kRollCallShare = 0.1;
constexpr double kRollCallMaxS = 5;
// The roll call's window for a --dist-timeout: kRollCallShare of it, 1 to kRollCallMaxS s.
double roll_call_window_s(double timeout_s);

// The rendezvous store gradscope run hosts for its ranks, listening on `address` alone (an
// address of this host) at `port`; port 0 = one the system picks (so no port in use can be
// taken), as for ranks on this machine at 127.0.0.1. Lives until destroyed.
class HostedStore {
 public:
  HostedStore(int world, double timeout_s, const std::string& address = "127.0.0.1",
              int port = 0);
  ~HostedStore();
  HostedStore(const HostedStore&) = delete;
  HostedStore& operator=(const HostedStore&) = delete;
  int port() const { return port_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace gradscope
