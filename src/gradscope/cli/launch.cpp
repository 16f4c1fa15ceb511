// gradscope run --nproc N: starts N ranks of the same command on this machine, each a copy of
// this executable with torchrun's variables set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT), meeting at a store this process hosts at 127.0.0.1 on a port the system picks.
// Across hosts (--nnodes M --node-rank R --nproc-per-node K), each host's gradscope starts its
// K ranks, numbered from R x K, and node 0's hosts the store at --master-addr:--master-port.
// Rank 0 writes the record; this process waits for its ranks, stops the others when one fails
// (so nothing hangs), forwards SIGTERM and SIGINT, and, on node 0, records the run as crashed
// when rank 0 died without writing its record.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "gradscope/cli/commands.h"
#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/log.h"
#include "gradscope/core/record.h"
#include "gradscope/comm/comm.h"
#include "gradscope/store/db.h"
#include "gradscope/train/session.h"
#include "gradscope/train/train_state.h"

namespace gradscope {
namespace {

std::vector<std::string>& command_line() {
  static std::vector<std::string> args;
  return args;
}

struct Rank {
  pid_t pid = -1;
  bool running = false;
  int status = 0;
};

const char* signal_text(int sig) {
  const char* s = strsignal(sig);
  return s ? s : "a signal";
}

// The ranks this host starts: all of them on one host, --nproc-per-node on each of several.
int64_t local_rank_count(const RunConfig& c) { return c.nproc / std::max<int64_t>(1, c.nnodes); }

// What a rank's end says, for messages.
std::string ending(int status) {
  if (WIFSIGNALED(status)) return fmt::format("was killed ({})", signal_text(WTERMSIG(status)));
  return fmt::format("exited with code {}", WEXITSTATUS(status));
}

// The checks before any rank starts: a command that takes ranks, ranks and threads this
// machine can give, a warning when the ranks outnumber its cores.
void check_rank_launch(const std::vector<std::string>& args, const RunConfig& c) {
  check_usage(!args.empty() && (args[0] == "run" || args[0] == "verify"),
              "--nproc starts ranks of `gradscope run` and `gradscope verify` only",
              "start the ranks with gradscope run --nproc N");
  check_usage(c.nnodes == 1 || !c.master_addr.empty(),
              fmt::format("--nnodes {} needs --master-addr: node 0's address", c.nnodes),
              "add --master-addr with an address of node 0 that every host reaches");
  const int64_t here = local_rank_count(c);
  check_local_ranks_here(here);
  if (c.threads > 0) check_threads_here(c.threads);  // each rank's, before any is started
  const int64_t cores = usable_cores();
  if (here > cores)
    log_warn(
        "{} ranks on this host are more than its cores ({}): they take turns on the cores, and "
        "step times measure that",
        here, cores);
}

// Everything the ranks' processes need, built before fork (after it only exec): the command
// line, and each rank's environment (this one's, less the launcher's variables, plus its
// own). Built in place and never moved, so that the pointers stay valid.
class RankCommands {
 public:
  RankCommands(const std::vector<std::string>& args, const RunConfig& c,
               const std::string& master_addr, const std::string& port,
               const std::string& marker) {
    const int64_t here = local_rank_count(c);
    const int64_t first = c.node_rank * here;
    arg_text_ = {"gradscope"};
    arg_text_.insert(arg_text_.end(), args.begin(), args.end());
    for (auto& a : arg_text_) argv_.push_back(a.data());
    argv_.push_back(nullptr);
    // The ranks share this process's threads (LibTorch's default: OMP_NUM_THREADS, else the
    // cores) unless --threads says each one's. Through OMP_NUM_THREADS, as torchrun does
    // (which sets 1), so that N ranks of the default never run N times the cores' threads.
    const std::string rank_threads =
        std::to_string(std::max<int64_t>(1, at::get_num_threads() / here));
    const std::string world = std::to_string(c.nproc);
    env_text_.resize(static_cast<size_t>(here));
    envp_.resize(static_cast<size_t>(here));
    const char* const launcher_names[] = {
        "RANK=",         "WORLD_SIZE=",   "LOCAL_RANK=",
        "MASTER_ADDR=",  "MASTER_PORT=",  "GRADSCOPE_RANK_LAUNCHER=",
        "SLURM_NTASKS=", "SLURM_PROCID=", "GRADSCOPE_RECORD_MARKER=", "OMP_NUM_THREADS=",
        "GLOO_SOCKET_IFNAME="};
    for (int r = 0; r < here; ++r) {
      auto& e = env_text_[static_cast<size_t>(r)];
      for (char** v = environ; *v; ++v) {
        bool ours = false;
        for (const char* name : launcher_names)
          ours = ours || std::strncmp(*v, name, std::strlen(name)) == 0;
        // GLOO_SOCKET_IFNAME stays unless --ifname names the interface instead.
        const bool interface = std::strncmp(*v, "GLOO_SOCKET_IFNAME=", 19) == 0;
        if (!ours || (interface && c.ifname.empty())) e.emplace_back(*v);
      }
      e.push_back("RANK=" + std::to_string(first + r));
      e.push_back("WORLD_SIZE=" + world);
      e.push_back("LOCAL_RANK=" + std::to_string(r));
      e.push_back("MASTER_ADDR=" + master_addr);
      e.push_back("MASTER_PORT=" + port);
      e.push_back(std::string(kLauncherVariable) + "=gradscope");
      e.push_back("OMP_NUM_THREADS=" + rank_threads);
      if (!c.ifname.empty()) e.push_back("GLOO_SOCKET_IFNAME=" + c.ifname);
      if (first + r == 0) e.push_back(std::string(kRecordMarkerVariable) + "=" + marker);
      for (auto& s : e) envp_[static_cast<size_t>(r)].push_back(s.data());
      envp_[static_cast<size_t>(r)].push_back(nullptr);
    }
  }
  RankCommands(const RankCommands&) = delete;
  RankCommands& operator=(const RankCommands&) = delete;
  char* const* argv() const { return argv_.data(); }
  char* const* envp(int rank) const { return envp_[static_cast<size_t>(rank)].data(); }

 private:
  std::vector<std::string> arg_text_;
  std::vector<char*> argv_;
  std::vector<std::vector<std::string>> env_text_;
  std::vector<std::vector<char*>> envp_;
};

// Forks and execs every rank; a rank that cannot start kills those started before it.
std::vector<Rank> start_ranks(const RankCommands& commands, int64_t nproc) {
  std::vector<Rank> ranks(static_cast<size_t>(nproc));
  const pid_t launcher_pid = getpid();
  for (int r = 0; r < nproc; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      for (const Rank& k : ranks)
        if (k.running) kill(k.pid, SIGKILL);
      fail_runtime("cannot start rank " + std::to_string(r) + ": " + std::strerror(errno));
    }
    if (pid == 0) {
      // A rank dies with its launcher (killed, it can neither wait for nor stop the ranks).
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher_pid) _exit(1);
      // Stops wait until the rank has its handlers (StopSignals unblocks them).
      sigset_t stops;
      sigemptyset(&stops);
      sigaddset(&stops, SIGTERM);
      sigaddset(&stops, SIGINT);
      sigprocmask(SIG_BLOCK, &stops, nullptr);
      execve("/proc/self/exe", commands.argv(), commands.envp(r));
      _exit(127);
    }
    ranks[static_cast<size_t>(r)] = {pid, true, 0};
  }
  return ranks;
}

// Waits for every rank, forwarding a stop. Once one fails, the others get --dist-timeout (at
// most) to notice it and record it, then they are killed.
void wait_for_ranks(std::vector<Rank>& ranks, const RunConfig& c, int64_t first) {
  using Clock = std::chrono::steady_clock;
  bool deadline_set = false;
  Clock::time_point deadline{};
  bool forwarded = false;
  int running = static_cast<int>(ranks.size());
  while (running > 0) {
    if (stop_requested() && !forwarded) {
      for (const Rank& k : ranks)
        if (k.running) kill(k.pid, SIGTERM);
      forwarded = true;
    }
    if (deadline_set && Clock::now() > deadline) {
      for (const Rank& k : ranks)
        if (k.running) kill(k.pid, SIGKILL);
      deadline_set = false;
    }
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    for (size_t r = 0; r < ranks.size(); ++r) {
      Rank& k = ranks[r];
      if (k.pid != pid || !k.running) continue;
      k.running = false;
      k.status = status;
      --running;
      // A rank ends with 0, 1 (its run failed: the others learn it from their collectives and
      // record it) or 75 as the run ends. Killed, or refusing to run (2), it leaves the
      // others waiting: they stop by themselves within --dist-timeout, and are killed after
      // twice that if they do not.
      const bool abnormal =
          WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0 &&
                                  WEXITSTATUS(status) != 1 && WEXITSTATUS(status) != kExitStopped);
      if (abnormal && !deadline_set && running > 0) {
        const double grace = 2 * c.dist_timeout_s + 10;
        log_warn("rank {} {}; the other ranks stop within {:.0f} s",
                 first + static_cast<int64_t>(r), ending(status), grace);
        deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(grace));
        deadline_set = true;
      }
    }
  }
}

// A host without rank 0 ends as its ranks did: 0 when all ended well, else the first other
// code among 2 (refused), 75 (stopped) and 1 (failed, or killed).
int hosts_exit_code(const std::vector<Rank>& ranks) {
  int code = 0;
  for (const Rank& k : ranks) {
    const int c = WIFEXITED(k.status) ? WEXITSTATUS(k.status) : 1;
    if (c != 0 && code == 0) code = (c == 2 || c == kExitStopped) ? c : 1;
  }
  return code;
}

// Rank 0 died without a record: the run crashed, and the database says so (through `store`).
[[noreturn]] void record_crash(const RunConfig& c,
                               const std::function<void(const RunRecord&)>& store,
                               const std::string& message, const std::string& started_at,
                               std::chrono::steady_clock::time_point t0) {
  RunRecord r;
  const ResolvedRun resolved = resolve_run(c);
  r.run_id = resolved.run_id;
  r.attempt_uid = new_attempt_uid();
  if (!c.sweep.empty()) r.sweep = c.sweep;
  r.config = resolved.config;
  r.arch = resolved.arch;
  r.status = RunStatus::kCrashed;
  r.failure = RunFailure{std::nullopt, std::nullopt, message};
  RunTime time;
  time.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.time = time;
  r.started_at = started_at;
  r.finished_at = utc_now_iso8601();
  store(r);
  fail_runtime(message + "; the run is recorded as crashed",
               "its output above says why; with --save-state, --resume continues from the last "
               "saved step");
}

}  // namespace

void set_run_command_line(std::vector<std::string> args) { command_line() = std::move(args); }

int launch_local_ranks(const RunConfig& c, const std::function<void(const RunRecord&)>& store) {
  const std::vector<std::string>& args = command_line();
  check_rank_launch(args, c);
  const bool run = args[0] == "run";
  const bool node0 = c.node_rank == 0;

  // One host: a store at 127.0.0.1 on a port the system picks. Several: node 0 hosts it at
  // --master-addr:--master-port, and the other hosts' ranks meet there.
  std::optional<HostedStore> meeting;
  std::string master_addr = "127.0.0.1";
  std::string port;
  if (c.nnodes == 1) {
    meeting.emplace(static_cast<int>(c.nproc), c.dist_timeout_s);
    port = std::to_string(meeting->port());
  } else {
    master_addr = c.master_addr;
    port = std::to_string(c.master_port);
    if (node0)
      meeting.emplace(static_cast<int>(c.nproc), c.dist_timeout_s, c.master_addr,
                      static_cast<int>(c.master_port));
  }
  // Rank 0 creates this file once its record is written: without it, the run ended without a
  // record, and this process writes the crashed one.
  std::string marker_dir =
      (std::filesystem::temp_directory_path() / "gradscope-ranks-XXXXXX").string();
  if (!mkdtemp(marker_dir.data()))
    fail_runtime(std::string("cannot make a private temporary folder: ") + std::strerror(errno));
  const std::string marker = (std::filesystem::path(marker_dir) / "recorded").string();
  const RankCommands commands(args, c, master_addr, port, marker);
  const std::string started_at = utc_now_iso8601();
  const auto t0 = std::chrono::steady_clock::now();

  std::vector<Rank> ranks = start_ranks(commands, local_rank_count(c));
  wait_for_ranks(ranks, c, c.node_rank * local_rank_count(c));

  std::error_code ec;
  const bool recorded = std::filesystem::exists(marker, ec);
  std::filesystem::remove_all(marker_dir, ec);
  if (!node0) return hosts_exit_code(ranks);
  const int status0 = ranks[0].status;
  if (WIFEXITED(status0)) {
    // Rank 0 wrote its record, or refused the settings (2: nothing ran, nothing to record).
    const int code = WEXITSTATUS(status0);
    if (recorded || !run || code == 2) return code;
  }
  if (!run) fail_runtime(fmt::format("rank 0 {}", ending(status0)), "its output above says why");
  if (recorded) return 1;
  record_crash(c, store, fmt::format("rank 0 {}", ending(status0)), started_at, t0);
}

}  // namespace gradscope
