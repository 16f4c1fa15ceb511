#include "gradscope/sweep/runner.h"
#include "gradscope/sweep/slurm.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/files.h"
#include "gradscope/core/json_input.h"
#include "gradscope/core/log.h"
#include "gradscope/train/train_state.h"

extern char** environ;

namespace gradscope {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Failed attempts (error, crashed, timeout) a run may have before the sweep stops trying.
constexpr int64_t kMaxFailedAttempts = 2;

int64_t failed_attempts(const std::vector<RunStatus>& statuses) {
  return std::count_if(statuses.begin(), statuses.end(), [](RunStatus s) {
    return !is_final_status(s) && s != RunStatus::kInterrupted;
  });
}

// `state_kept`: the run's training state folder holds a state. A kept state is resumed
// whatever the last stored status: a child may save its state and die before it records
// itself (its sweep killed), and the state is then the best of what is left.
std::string decide(const std::vector<RunStatus>& statuses, bool state_kept) {
  if (std::any_of(statuses.begin(), statuses.end(), is_final_status)) return "done";
  const int64_t failed = failed_attempts(statuses);
  if (failed >= kMaxFailedAttempts) return "given up";
  if (state_kept) return "resume";
  return failed == 0 ? "run" : "retry";
}

// The lookup a resume makes (find_train_state): the folder, or a state a save left aside.
// With ranks each keeps STATE/rank-R: rank 0's part says whether there is one.
bool state_kept(const std::string& log_dir, const std::string& run_id, int64_t nproc) {
  return !log_dir.empty() &&
         !find_train_state(rank_state_folder(run_state_folder(log_dir, run_id), nproc, 0)).empty();
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The last `max_bytes` of a file, from its last complete line on.
std::string file_tail(const std::string& path, size_t max_bytes = 2000) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() > max_bytes) {
    text = text.substr(text.size() - max_bytes);
    const auto nl = text.find('\n');
    if (nl != std::string::npos) text = text.substr(nl + 1);
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}

std::string last_line_with(const std::string& text, const std::string& needle) {
  std::string found;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const auto cr = line.rfind('\r');  // a progress bar redraws its line with \r
    if (cr != std::string::npos) line = line.substr(cr + 1);
    if (line.find(needle) != std::string::npos) found = line;
  }
  return found;
}

// The last "error: ..." line of a child's output, else its last line.
std::string failure_message(const std::string& log) {
  const std::string tail = file_tail(log);
  std::string message = last_line_with(tail, "error: ");
  if (message.empty())
    message = tail.substr(tail.rfind('\n') == std::string::npos ? 0 : tail.rfind('\n') + 1);
  return message;
}

bool looks_like_oom(const std::string& text) {
  return text.find("can't allocate memory") != std::string::npos ||
         text.find("bad_alloc") != std::string::npos ||
         text.find("out of memory") != std::string::npos ||
         text.find("Cannot allocate memory") != std::string::npos;
}

// A child process: argv and environment are prepared before fork, so that the child only
// makes async-signal-safe calls (the parent may have threads) until execve.
class Child {
 public:
  // `lock_fd`: the sweep's lock (SweepLock::fd), handed to the child so that the lock lasts
  // while the child does, even past the sweep's death; -1 for none.
  Child(const std::string& executable, int executable_fd, const std::vector<std::string>& args,
        const std::vector<std::string>& extra_env, const std::string& log, int64_t memory_limit,
        int lock_fd) {
    argv_text_ = {executable};
    argv_text_.insert(argv_text_.end(), args.begin(), args.end());
    for (auto& a : argv_text_) argv_.push_back(a.data());
    argv_.push_back(nullptr);
    std::vector<std::string> replaced;
    for (const auto& e : extra_env) replaced.push_back(e.substr(0, e.find('=') + 1));
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      const bool overridden = std::any_of(replaced.begin(), replaced.end(),
                                          [&](const auto& k) { return entry.rfind(k, 0) == 0; });
      if (!overridden) env_text_.push_back(entry);
    }
    env_text_.insert(env_text_.end(), extra_env.begin(), extra_env.end());
    for (auto& e : env_text_) envp_.push_back(e.data());
    envp_.push_back(nullptr);

    const pid_t parent = getpid();
    const int log_fd =
        open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (log_fd < 0)
      fail_runtime(fmt::format("cannot write the run log {}: {}", log, std::strerror(errno)),
                   "check that the log folder is writable");
    pid_ = fork();
    if (pid_ < 0) {
      close(log_fd);
      fail_runtime(fmt::format("cannot start a run: fork failed: {}", std::strerror(errno)),
                   "too many processes? lower --jobs");
    }
    if (pid_ == 0) {
      // The sweep's stop handlers are of no use here (their flag is the parent's): a signal
      // before execve ends the child, which has nothing to save yet.
      struct sigaction plain {};
      plain.sa_handler = SIG_DFL;
      sigemptyset(&plain.sa_mask);
      sigaction(SIGTERM, &plain, nullptr);
      sigaction(SIGINT, &plain, nullptr);
      // Stop with the sweep: an orphan could finish and store a run its resume starts again.
      // SIGTERM, not SIGKILL, so that the run saves its state and records itself first.
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(111);
      dup2(log_fd, STDOUT_FILENO);
      dup2(log_fd, STDERR_FILENO);
      // The same open lock, kept across execve: while the child lives (finishing after a killed
      // sweep), no other sweep takes the database and starts the run again.
      if (lock_fd >= 0) fcntl(lock_fd, F_SETFD, 0);
      if (memory_limit > 0) {
        struct rlimit limit;
        limit.rlim_cur = limit.rlim_max = static_cast<rlim_t>(memory_limit);
        setrlimit(RLIMIT_AS, &limit);
      }
      if (executable_fd >= 0) fexecve(executable_fd, argv_.data(), envp_.data());
      execve(argv_[0], argv_.data(), envp_.data());  // where fexecve is refused
      _exit(127);
    }
    close(log_fd);
  }
  pid_t pid() const { return pid_; }

 private:
  std::vector<std::string> argv_text_, env_text_;
  std::vector<char*> argv_, envp_;
  pid_t pid_ = -1;
};

// A run being attempted.
struct Attempt {
  size_t index = 0;  // into the plan
  int slot = 0;      // which of the --jobs places (and GPU) it occupies
  std::unique_ptr<Child> child;
  std::chrono::steady_clock::time_point started;
  std::string started_at, log, result;
  int64_t stored_before = 0;  // attempts of this run in the database when it started
  int64_t threads = 0;        // --threads the sweep gave the child (0: the run sets its own)
  bool timed_out = false;
  double last_heartbeat_s = 0;
  std::string state;  // its training state folder
};

std::string signal_name(int sig) {
  const char* name = strsignal(sig);
  return fmt::format("signal {} ({})", sig, name != nullptr ? name : "unknown");
}

int visible_gpus() {
  const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
  if (env != nullptr) {
    const std::string text = env;
    if (text.empty()) return 0;
    return static_cast<int>(std::count(text.begin(), text.end(), ',')) + 1;
  }
  int n = 0;
  while (fs::exists(fmt::format("/dev/nvidia{}", n))) ++n;
  return n;
}

std::string loss_text(const std::optional<double>& v) {
  return v ? fmt::format("{:.4f}", *v) : std::string("n/a");
}

}  // namespace

std::string run_state_folder(const std::string& log_dir, const std::string& run_id) {
  return (fs::path(log_dir) / (run_id + ".state")).string();
}

std::vector<PlannedRun> resolve_sweep(const Sweep& sweep, const RunArgumentParser& parse) {
  std::vector<PlannedRun> plan;
  plan.reserve(sweep.runs.size());
  std::map<std::string, size_t> first_with_id;  // run id -> index of the run that has it
  for (size_t i = 0; i < sweep.runs.size(); ++i) {
    PlannedRun p;
    p.spec = sweep.runs[i];
    p.label = p.spec.label(sweep.axes);
    try {
      p.resolved = resolve_run(parse(p.spec.args()));
      p.run_id = p.resolved.run_id;
      // A sweep starts its runs on this host: the other hosts' ranks would never come.
      check_usage(p.resolved.config.nnodes == 1,
                  fmt::format("nnodes {} needs every host to start its ranks, and a sweep "
                              "starts its runs on this host alone",
                              p.resolved.config.nnodes),
                  "start a run across hosts with `gradscope run --nnodes` on each host "
                  "(docs/distributed.md)");
    } catch (const Error& e) {
      fail_usage(fmt::format("{}: run {} of {} ({}) is not a valid run: {}", sweep.path, i + 1,
                             sweep.runs.size(), p.label, e.what()),
                 e.hint());
    }
    // Two runs of one id would be one run attempted twice, and the report would keep one:
    // settings outside the id (a device index, threads) or an override that makes two
    // runs equal.
    const auto [it, fresh] = first_with_id.emplace(p.run_id, i);
    if (!fresh)
      fail_usage(fmt::format("{}: runs {} ({}) and {} ({}) are the same run (id {})", sweep.path,
                             it->second + 1, plan[it->second].label, i + 1, p.label, p.run_id),
                 "make them differ in a setting that defines the run, or drop one (an "
                 "[[exclude]]); settings such as threads or the device index are not part of it");
    plan.push_back(std::move(p));
  }
  return plan;
}

std::vector<PlannedRun> plan_sweep(const Sweep& sweep, Database& db, const RunArgumentParser& parse,
                                   const std::string& log_dir) {
  std::vector<PlannedRun> plan = resolve_sweep(sweep, parse);
  decide_actions(plan, db, log_dir);
  return plan;
}

void decide_actions(std::vector<PlannedRun>& plan, Database& db, const std::string& log_dir) {
  for (PlannedRun& p : plan) {
    p.previous = db.statuses_of(p.run_id);
    p.action = decide(p.previous, state_kept(log_dir, p.run_id, p.resolved.config.nproc));
  }
}

namespace {

// The run record a child left in its result file, when it is one of this run.
std::optional<RunRecord> finished_record(const std::string& path, const std::string& run_id) {
  std::error_code ec;
  if (path.empty() || !fs::is_regular_file(path, ec)) return std::nullopt;
  std::optional<RunRecord> record = read_result_file(path, nullptr);
  if (record && record->run_id == run_id) return record;
  return std::nullopt;
}

}  // namespace

namespace {

// One sweep's execution: the queue of pending runs, the children running (each in one of
// `jobs` places, each place a GPU where the runs use CUDA) and the tallies that its progress
// lines print.
class SweepExecution {
 public:
  SweepExecution(const Sweep& sweep, std::vector<PlannedRun>& plan, Database& db,
                 const SweepOptions& o);
  // Runs the queue to its end, or until a stop signal has stopped the running children.
  void run();
  int64_t failed() const { return static_cast<int64_t>(failed_); }
  // The runs the stop left for the next sweep: recorded interrupted, or kept from starting.
  int64_t left_interrupted() const {
    return left_interrupted_ + (stopping_ ? static_cast<int64_t>(queue_.size()) : 0);
  }

 private:
  void print_header() const;
  bool confirm_resume(const PlannedRun& run, const Attempt& a, int64_t& run_threads) const;
  std::vector<std::string> child_args(const PlannedRun& run, Attempt& a, int64_t run_threads,
                                      bool resume) const;
  void launch(size_t index);
  RunStatus settle(const Attempt& a, int wait_status, double elapsed, std::string& detail);
  RunStatus failure_without_record(const Attempt& a, int wait_status, double elapsed,
                                   std::string& message) const;
  void reap(Attempt& a, int wait_status);
  void begin_stop();
  void watch_running();

  const Sweep& sweep_;
  std::vector<PlannedRun>& plan_;
  Database& db_;
  const SweepOptions& o_;
  FILE* out_;
  // SIGTERM and SIGINT stop the sweep: its children are stopped and recorded, none starts.
  const StopSignals stop_signals_;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point stop_started_;
  int64_t left_interrupted_ = 0;
  bool cuda_ = false;  // the runs use CUDA: one GPU each
  int gpus_ = 0;
  int64_t jobs_ = 1;
  int64_t threads_ = 1;  // --threads of each child that sets none itself
  std::deque<size_t> queue_;
  size_t total_ = 0, finished_ = 0, failed_ = 0;
  double finished_seconds_ = 0;
  std::map<pid_t, Attempt> active_;
  std::vector<bool> slot_busy_;
  int attempt_counter_ = 0;
};

SweepExecution::SweepExecution(const Sweep& sweep, std::vector<PlannedRun>& plan, Database& db,
                               const SweepOptions& o)
    : sweep_(sweep), plan_(plan), db_(db), o_(o), out_(o.out) {
  // CUDA runs get one GPU each: as many places as GPUs, each child sees its own.
  cuda_ = std::any_of(plan.begin(), plan.end(), [](const PlannedRun& p) {
    return p.pending() && p.resolved.config.device.rfind("cuda", 0) == 0;
  });
  jobs_ = std::max<int64_t>(1, o.jobs);
  gpus_ = cuda_ ? visible_gpus() : 0;
  if (cuda_ && gpus_ > 0) jobs_ = std::min<int64_t>(jobs_, gpus_);
  // CPU threads split between the children, unless a run sets its own: the threads a run here
  // would take by default (LibTorch's: OMP_NUM_THREADS, else the machine's cores).
  const int64_t cores = std::max(1, at::get_num_threads());
  threads_ = std::max<int64_t>(1, cores / jobs_);

  for (size_t i = 0; i < plan.size(); ++i)
    if (plan[i].pending()) queue_.push_back(i);
  total_ = queue_.size();
  for (PlannedRun& run : plan)  // the plan was made before; a state may have gone since
    if (run.action == "resume" && !state_kept(o.log_dir, run.run_id, run.resolved.config.nproc))
      run.action = decide(run.previous, false);
  slot_busy_.assign(static_cast<size_t>(jobs_), false);
  print_header();
}

void SweepExecution::print_header() const {
  fmt::print(
      out_,
      "sweep {}: {} runs, {} to run, {} done, {} given up; {} at a time, {} "
      "thread{} each\n",
      sweep_.name, plan_.size(), total_,
      std::count_if(plan_.begin(), plan_.end(), [](auto& p) { return p.action == "done"; }),
      std::count_if(plan_.begin(), plan_.end(), [](auto& p) { return p.action == "given up"; }),
      jobs_, threads_, threads_ == 1 ? "" : "s");
  std::fflush(out_);
}

// Whether a run to resume can be: with ranks, every rank's part of its state must be there,
// of this build and run, at one step. A resumed run continues with the threads its state was
// saved with (a setting of how it is measured, which a resume must keep), into `run_threads`.
bool SweepExecution::confirm_resume(const PlannedRun& run, const Attempt& a,
                                    int64_t& run_threads) const {
  std::string why;
  const std::optional<TrainStateInfo> info =
      resumable_state(a.state, run.resolved.config.nproc, run.run_id, &why);
  if (!info) {
    fmt::print(out_, "{}: its training state cannot be resumed ({}); starting it again\n",
               run.label, terminal_text(why.empty() ? "it is gone" : why));
    return false;
  }
  const nlohmann::json saved = info->config.value("threads", nlohmann::json(nullptr));
  if (saved.is_number_integer() && saved.get<int64_t>() > 0) run_threads = saved.get<int64_t>();
  return true;
}

// The child's `gradscope run` arguments: the run's own, what the sweep decides (threads
// unless the run sets them, the database, the result file, the state folder), a resume.
std::vector<std::string> SweepExecution::child_args(const PlannedRun& run, Attempt& a,
                                                    int64_t run_threads, bool resume) const {
  std::vector<std::string> args = {"run"};
  if (!run.spec.values.count("threads")) {
    args.push_back("--threads");
    args.push_back(std::to_string(run_threads));
    a.threads = run_threads;
  }
  const auto spec_args = run.spec.args();
  args.insert(args.end(), spec_args.begin(), spec_args.end());
  for (const std::string& extra :
       {std::string("--db"), o_.db_path, std::string("--sweep"), sweep_.name,
        std::string("--json"), a.result, std::string("--save-state"), a.state})
    args.push_back(extra);
  if (resume) {
    args.push_back("--resume");
    args.push_back(a.state);
  }
  return args;
}

void SweepExecution::launch(size_t index) {
  PlannedRun& run = plan_[index];
  Attempt a;
  a.index = index;
  a.slot =
      static_cast<int>(std::find(slot_busy_.begin(), slot_busy_.end(), false) - slot_busy_.begin());
  slot_busy_[static_cast<size_t>(a.slot)] = true;
  const std::string stem = free_attempt_stem(o_.log_dir, run.run_id, attempt_counter_);
  a.log = (fs::path(o_.log_dir) / (stem + ".log")).string();
  a.result = (fs::path(o_.log_dir) / (stem + ".json")).string();
  a.state = run_state_folder(o_.log_dir, run.run_id);
  // A damaged state is dropped and the run starts again.
  int64_t run_threads = threads_;
  bool resume = run.action == "resume";
  if (resume) resume = confirm_resume(run, a, run_threads);
  if (!resume) remove_train_state(a.state);  // a state of an earlier attempt
  const std::vector<std::string> args = child_args(run, a, run_threads, resume);
  std::vector<std::string> env;
  if (cuda_ && gpus_ > 0) env.push_back(fmt::format("CUDA_VISIBLE_DEVICES={}", a.slot));
  a.stored_before = static_cast<int64_t>(db_.statuses_of(run.run_id).size());
  a.started = std::chrono::steady_clock::now();
  a.started_at = utc_now_iso8601();
  a.child = std::make_unique<Child>(o_.executable, o_.executable_fd, args, env, a.log,
                                    o_.memory_limit_bytes, o_.lock_fd);
  fmt::print(out_, "[{}/{}] {} ({}{}) started, pid {}, log {}\n", finished_ + active_.size() + 1,
             total_, run.label, run.run_id,
             resume                  ? ", resumed"
             : run.action == "retry" ? ", retry"
                                     : "",
             a.child->pid(), a.log);
  std::fflush(out_);
  active_.emplace(a.child->pid(), std::move(a));
}

// The status of an attempt that has ended, and a line on it (`detail`): from the record it
// left, else from the database, else from how it ended (then recorded here).
RunStatus SweepExecution::settle(const Attempt& a, int wait_status, double elapsed,
                                 std::string& detail) {
  const PlannedRun& run = plan_[a.index];
  if (std::optional<RunRecord> left = finished_record(a.result, run.run_id)) {
    // The child finished and wrote its record file first. It stored the record too, or
    // could not (the database was locked or refused it): then it is stored from the file.
    // Its attempt_uid says which, whatever else reached the database meanwhile.
    db_.write_run_if_new(*left);
    detail = left->failure ? left->failure->message
                           : fmt::format("loss {}", loss_text(left->final_loss));
    return left->status;
  }
  if (static_cast<int64_t>(db_.statuses_of(run.run_id).size()) > a.stored_before) {
    // No record file but a new attempt stored (a child without --json support, or its
    // file removed): take the status from the database.
    const std::optional<RunRecord> record = db_.latest_record(run.run_id);
    if (!record) return RunStatus::kError;
    detail = record->failure ? record->failure->message
                             : fmt::format("loss {}", loss_text(record->final_loss));
    return record->status;
  }
  const RunStatus status = failure_without_record(a, wait_status, elapsed, detail);
  db_.write_run(failure_record(run, sweep_.name, status, detail, a.log, a.started_at, elapsed,
                               a.threads));
  return status;
}

// How an attempt that left no record ended: past its run_timeout, stopped, killed, or exited
// with an error (out of memory where its log says so).
RunStatus SweepExecution::failure_without_record(const Attempt& a, int wait_status,
                                                 double elapsed, std::string& message) const {
  const int code = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1;
  if (a.timed_out) {
    message = fmt::format("stopped after {:.0f} s (run_timeout)", elapsed);
    return RunStatus::kTimeout;
  }
  if ((stopping_ && WIFSIGNALED(wait_status)) || code == kExitStopped) {
    // Stopped before its training began (exit 75 without a record), or with the sweep and
    // killed before it could record itself (its state, if it saved one, is whole).
    message = WIFSIGNALED(wait_status)
                  ? fmt::format("stopped with the sweep: killed by {}",
                                signal_name(WTERMSIG(wait_status)))
                  : fmt::format("stopped before its training began (exit code {})", code);
    return RunStatus::kInterrupted;
  }
  const std::string tail = file_tail(a.log);
  if (WIFSIGNALED(wait_status)) {
    message = fmt::format("killed by {}", signal_name(WTERMSIG(wait_status)));
    return o_.memory_limit_bytes > 0 && looks_like_oom(tail) ? RunStatus::kOom
                                                             : RunStatus::kCrashed;
  }
  message = fmt::format("exit code {}: {}", code, failure_message(a.log));
  return looks_like_oom(tail) ? RunStatus::kOom
         : code == 2          ? RunStatus::kError
                              : RunStatus::kCrashed;
}

// An attempt has ended: its status settled, the run's next action decided (retried at once,
// left for the next sweep, or done), and its progress line printed.
void SweepExecution::reap(Attempt& a, int wait_status) {
  PlannedRun& run = plan_[a.index];
  slot_busy_[static_cast<size_t>(a.slot)] = false;
  const double elapsed = seconds_since(a.started);
  std::string detail;
  const RunStatus status = settle(a, wait_status, elapsed, detail);
  std::error_code ec;
  fs::remove(a.result, ec);
  const bool stopped = status == RunStatus::kInterrupted;
  // Kept for the next sweep to resume from; of no use once the run has any other status.
  if (!stopped) remove_train_state(a.state);
  run.previous.push_back(status);
  run.action = decide(run.previous, state_kept(o_.log_dir, run.run_id, run.resolved.config.nproc));
  // An interrupted run was asked to stop: the next sweep resumes it, this one does not.
  const bool retry = run.pending() && !stopped;
  if (stopped) {
    ++left_interrupted_;
  } else if (retry) {
    queue_.push_front(a.index);
  } else {
    ++finished_;
    finished_seconds_ += elapsed;
    if (!is_final_status(status)) ++failed_;
  }
  const size_t left = queue_.size() + active_.size();  // `a` has left `active_` already
  const double eta = finished_ > 0 ? finished_seconds_ / static_cast<double>(finished_) *
                                         static_cast<double>(left) / static_cast<double>(jobs_)
                                   : 0.0;
  const char* next = retry                    ? ", will retry once"
                     : !stopped               ? ""
                     : run.action == "resume" ? ", the next sweep resumes it"
                                              : ", the next sweep starts it again";
  fmt::print(out_, "[{}/{}] {}: {} in {} ({}){}; done {}, failed {}, left {}{}\n", finished_,
             total_, run.label, status_name(status), format_duration(elapsed),
             terminal_text(detail), next, finished_ - failed_, failed_, left,
             finished_ > 0 && left > 0 && !stopping_ ? ", eta " + format_duration(eta) : "");
  std::fflush(out_);
}

// A stop signal came: the running children are asked to save and stop, none starts.
void SweepExecution::begin_stop() {
  stopping_ = true;
  stop_started_ = std::chrono::steady_clock::now();
  fmt::print(out_,
             "stopping: {} running run{} asked to save and stop (up to {}), {} not "
             "started\n",
             active_.size(), active_.size() == 1 ? "" : "s", format_duration(o_.stop_grace_s),
             queue_.size());
  std::fflush(out_);
  for (const auto& [child_pid, a] : active_) kill(child_pid, SIGTERM);
}

// The running children: one past its run_timeout is killed, a long one reports its last step.
void SweepExecution::watch_running() {
  for (auto& [child_pid, a] : active_) {
    const double elapsed = seconds_since(a.started);
    if (o_.run_timeout_s > 0 && elapsed > o_.run_timeout_s && !a.timed_out) {
      a.timed_out = true;
      kill(child_pid, SIGKILL);
    }
    if (o_.heartbeat_s > 0 && elapsed - a.last_heartbeat_s >= o_.heartbeat_s) {
      a.last_heartbeat_s = elapsed;
      const std::string step = last_line_with(file_tail(a.log), "step ");
      fmt::print(out_, "  ... {}: {} running{}\n", plan_[a.index].label, format_duration(elapsed),
                 step.empty() ? "" : ", " + step);
      std::fflush(out_);
    }
  }
}

void SweepExecution::run() {
  while ((!queue_.empty() && !stopping_) || !active_.empty()) {
    if (stop_requested() && !stopping_) begin_stop();
    if (stopping_ && seconds_since(stop_started_) > o_.stop_grace_s)
      for (auto& [child_pid, a] : active_) kill(child_pid, SIGKILL);
    while (!stopping_ && !queue_.empty() && static_cast<int64_t>(active_.size()) < jobs_) {
      const size_t next = queue_.front();
      queue_.pop_front();
      launch(next);
    }
    int wait_status = 0;
    const pid_t pid = waitpid(-1, &wait_status, WNOHANG);
    if (pid > 0) {
      auto it = active_.find(pid);
      if (it != active_.end()) {
        Attempt attempt = std::move(it->second);
        active_.erase(it);
        reap(attempt, wait_status);
      }
      continue;
    }
    watch_running();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

int64_t run_sweep(const Sweep& sweep, std::vector<PlannedRun>& plan, Database& db,
                  const SweepOptions& o, int64_t* interrupted) {
  fs::create_directories(o.log_dir);
  SweepExecution execution(sweep, plan, db, o);
  execution.run();
  // Runs the stop kept from starting (or from their retry) are left for the next sweep too.
  if (interrupted) *interrupted = execution.left_interrupted();
  return execution.failed();
}

std::string sweep_summary(const std::vector<PlannedRun>& plan, Database& db) {
  std::vector<std::vector<std::string>> rows = {
      {"run", "status", "attempts", "final loss", "val loss", "val acc", "step", "peak memory"}};
  for (const PlannedRun& p : plan) {
    const std::optional<RunRecord> r = db.latest_record(p.run_id);
    const auto statuses = db.statuses_of(p.run_id);
    std::string step = "n/a", peak = "n/a", acc = "n/a";
    if (r) {
      if (r->time && r->time->step_median_s) step = format_duration(*r->time->step_median_s);
      if (r->memory) peak = format_bytes(static_cast<double>(r->memory->peak_bytes));
      if (r->final_accuracy) acc = fmt::format("{:.1f}%", 100 * *r->final_accuracy);
    }
    rows.push_back({p.label, r ? status_name(r->status) : "not run",
                    std::to_string(statuses.size()), r ? loss_text(r->final_loss) : "n/a",
                    r ? loss_text(r->final_val_loss) : "n/a", acc, step, peak});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  std::string text;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c)
      line += c == 0 ? fmt::format("{:<{}}", row[c], width[c])
                     : fmt::format("  {:>{}}", row[c], width[c]);
    text += line + "\n";
  }
  return text;
}

}  // namespace gradscope
