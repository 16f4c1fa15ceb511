#include "gradscope/sweep/runner.h"
#include "gradscope/sweep/slurm.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
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
    return !is_final_status(s) && s != RunStatus::kStatusInterrupted;
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

RunRecord failure_record(const PlannedRun& run, const std::string& sweep, RunStatus status,
                         const std::string& message, const std::string& log,
                         const std::string& started_at, double elapsed_s, int64_t threads) {
  RunRecord r;
  r.run_id = run.run_id;
  r.attempt_uid = new_attempt_uid();
  r.sweep = sweep;
  r.config = run.resolved.config;
  if (threads > 0) r.config.threads = static_cast<int>(threads);
  r.arch = run.resolved.arch;
  r.status = status;
  r.failure = RunFailure{std::nullopt, std::nullopt, message};
  RunTime time;
  time.wall_s = elapsed_s;
  r.time = time;
  r.log = log;
  r.started_at = started_at;
  r.finished_at = utc_now_iso8601();
  return r;
}

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

std::optional<RunRecord> read_result_file(const std::string& path, std::string* why) {
  const auto refuse = [why](const std::string& reason) -> std::optional<RunRecord> {
    if (why) *why = reason;
    return std::nullopt;
  };
  try {
    const std::string text = read_input_file(path, "result file", kMaxRecordBytes);
    std::optional<nlohmann::json> j = try_parse_json(text, why);
    if (!j) return std::nullopt;
    // A parser keeps one of two equal keys: a record with a repeated key is ambiguous.
    const std::string repeated = repeated_key_problem(text);
    if (!repeated.empty()) return refuse(repeated);
    RunRecord record = record_from_json(*j);
    if (record.attempt_uid.empty()) return refuse("it has no attempt_uid");
    return record;
  } catch (const Error& e) {
    return refuse(e.what());
  } catch (const std::exception& e) {  // a record that breaks an assumption of the reader
    return refuse(std::string("it does not follow the run record: ") + e.what());
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

SweepLock::SweepLock(const std::string& db_path) {
  // Beside the file the path resolves to, so that two spellings of one database (a
  // symbolic link, a relative path) take one lock. Not through a link at the lock's own
  // name: the holder's note is written into the file.
  std::error_code ec;
  const fs::path real = fs::weakly_canonical(db_path, ec);
  const std::string path = (ec ? fs::path(db_path) : real).string() + ".sweep-lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
  if (fd_ < 0)
    fail_usage(fmt::format("cannot open the sweep lock {}: {}", path, std::strerror(errno)),
               "the database's folder must be writable");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    char holder[256] = {};
    const ssize_t n = ::pread(fd_, holder, sizeof(holder) - 1, 0);
    std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "";
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    ::close(fd_);
    fd_ = -1;
    if (error != EWOULDBLOCK)
      fail_usage(fmt::format("cannot lock {}: {}", path, std::strerror(error)),
                 "the database's file system must support flock");
    fail_usage(fmt::format("another sweep is running on {}{}", db_path,
                           who.empty() ? "" : " (" + who + ")"),
               "one sweep at a time per database, and a sweep's runs hold its lock until they "
               "end (a killed sweep's runs save their state and stop): wait for them, or pass "
               "another --db (`gradscope sweep --dry-run` shows the plan meanwhile)");
  }
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  const std::string holder =
      fmt::format("pid {} on {}, since {}\n", getpid(), host, utc_now_iso8601());
  if (::ftruncate(fd_, 0) == 0) {
    const ssize_t written = ::pwrite(fd_, holder.data(), holder.size(), 0);
    (void)written;  // the note is for people; the lock is what counts
  }
}

SweepLock::~SweepLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

SelfExecutable::SelfExecutable() { fd_ = ::open("/proc/self/exe", O_RDONLY | O_CLOEXEC); }

SelfExecutable::~SelfExecutable() {
  if (fd_ >= 0) ::close(fd_);
}

std::string free_attempt_stem(const std::string& log_dir, const std::string& run_id, int& counter) {
  while (true) {
    const std::string stem = fmt::format("{}-{}", run_id, ++counter);
    std::error_code ec;
    if (fs::exists(fs::path(log_dir) / (stem + ".json"), ec)) continue;
    // The log is claimed by creating it, so that two sweeps sharing a log folder (on two
    // databases) never take one name; the child's output is then written into it.
    const std::string log = (fs::path(log_dir) / (stem + ".log")).string();
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::close(fd);
      return stem;
    }
    if (errno != EEXIST)
      fail_runtime(fmt::format("cannot write the run log {}: {}", log, std::strerror(errno)),
                   "check that the log folder is writable");
  }
}

int64_t run_sweep(const Sweep& sweep, std::vector<PlannedRun>& plan, Database& db,
                  const SweepOptions& o, int64_t* interrupted) {
  FILE* out = o.out;
  fs::create_directories(o.log_dir);
  // SIGTERM and SIGINT stop the sweep: its children are stopped and recorded, none starts.
  const StopSignals stop_signals;
  bool stopping = false;
  std::chrono::steady_clock::time_point stop_started;
  int64_t left_interrupted = 0;

  // CUDA runs get one GPU each: as many places as GPUs, each child sees its own.
  const bool cuda = std::any_of(plan.begin(), plan.end(), [](const PlannedRun& p) {
    return p.pending() && p.resolved.config.device.rfind("cuda", 0) == 0;
  });
  int64_t jobs = std::max<int64_t>(1, o.jobs);
  const int gpus = cuda ? visible_gpus() : 0;
  if (cuda && gpus > 0) jobs = std::min<int64_t>(jobs, gpus);
  // CPU threads split between the children, unless a run sets its own: the threads a run here
  // would take by default (LibTorch's: OMP_NUM_THREADS, else the machine's cores).
  const int64_t cores = std::max(1, at::get_num_threads());
  const int64_t threads = std::max<int64_t>(1, cores / jobs);

  std::deque<size_t> queue;
  for (size_t i = 0; i < plan.size(); ++i)
    if (plan[i].pending()) queue.push_back(i);
  const size_t total = queue.size();
  size_t finished = 0, failed = 0;
  for (PlannedRun& run : plan)  // the plan was made before; a state may have gone since
    if (run.action == "resume" && !state_kept(o.log_dir, run.run_id, run.resolved.config.nproc))
      run.action = decide(run.previous, false);
  double finished_seconds = 0;
  fmt::print(
      out,
      "sweep {}: {} runs, {} to run, {} done, {} given up; {} at a time, {} "
      "thread{} each\n",
      sweep.name, plan.size(), total,
      std::count_if(plan.begin(), plan.end(), [](auto& p) { return p.action == "done"; }),
      std::count_if(plan.begin(), plan.end(), [](auto& p) { return p.action == "given up"; }), jobs,
      threads, threads == 1 ? "" : "s");
  std::fflush(out);

  std::map<pid_t, Attempt> active;
  std::vector<bool> slot_busy(static_cast<size_t>(jobs), false);
  int attempt_counter = 0;

  const auto launch = [&](size_t index) {
    PlannedRun& run = plan[index];
    Attempt a;
    a.index = index;
    a.slot =
        static_cast<int>(std::find(slot_busy.begin(), slot_busy.end(), false) - slot_busy.begin());
    slot_busy[static_cast<size_t>(a.slot)] = true;
    const std::string stem = free_attempt_stem(o.log_dir, run.run_id, attempt_counter);
    a.log = (fs::path(o.log_dir) / (stem + ".log")).string();
    a.result = (fs::path(o.log_dir) / (stem + ".json")).string();
    a.state = run_state_folder(o.log_dir, run.run_id);
    // A resumed run continues with the threads its state was saved with (a setting of how it
    // is measured, which a resume must keep); a damaged state is dropped and the run starts
    // again.
    int64_t run_threads = threads;
    bool resume = run.action == "resume";
    if (resume) {
      // With ranks, every rank's part must be there, of this build and run, at one step.
      std::string why;
      const std::optional<TrainStateInfo> info =
          resumable_state(a.state, run.resolved.config.nproc, run.run_id, &why);
      if (info) {
        const nlohmann::json saved = info->config.value("threads", nlohmann::json(nullptr));
        if (saved.is_number_integer() && saved.get<int64_t>() > 0)
          run_threads = saved.get<int64_t>();
      } else {
        fmt::print(out, "{}: its training state cannot be resumed ({}); starting it again\n",
                   run.label, terminal_text(why.empty() ? "it is gone" : why));
        resume = false;
      }
    }
    if (!resume) remove_train_state(a.state);  // a state of an earlier attempt
    std::vector<std::string> args = {"run"};
    if (!run.spec.values.count("threads")) {
      args.push_back("--threads");
      args.push_back(std::to_string(run_threads));
      a.threads = run_threads;
    }
    const auto spec_args = run.spec.args();
    args.insert(args.end(), spec_args.begin(), spec_args.end());
    for (const std::string& extra :
         {std::string("--db"), o.db_path, std::string("--sweep"), sweep.name, std::string("--json"),
          a.result, std::string("--save-state"), a.state})
      args.push_back(extra);
    if (resume) {
      args.push_back("--resume");
      args.push_back(a.state);
    }
    std::vector<std::string> env;
    if (cuda && gpus > 0) env.push_back(fmt::format("CUDA_VISIBLE_DEVICES={}", a.slot));
    a.stored_before = static_cast<int64_t>(db.statuses_of(run.run_id).size());
    a.started = std::chrono::steady_clock::now();
    a.started_at = utc_now_iso8601();
    a.child = std::make_unique<Child>(o.executable, o.executable_fd, args, env, a.log,
                                      o.memory_limit_bytes, o.lock_fd);
    fmt::print(out, "[{}/{}] {} ({}{}) started, pid {}, log {}\n", finished + active.size() + 1,
               total, run.label, run.run_id,
               resume                  ? ", resumed"
               : run.action == "retry" ? ", retry"
                                       : "",
               a.child->pid(), a.log);
    std::fflush(out);
    active.emplace(a.child->pid(), std::move(a));
  };

  const auto reap = [&](Attempt& a, int wait_status) {
    PlannedRun& run = plan[a.index];
    slot_busy[static_cast<size_t>(a.slot)] = false;
    const double elapsed = seconds_since(a.started);
    RunStatus status = RunStatus::kStatusError;
    std::string detail;
    if (std::optional<RunRecord> left = finished_record(a.result, run.run_id)) {
      // The child finished and wrote its record file first. It stored the record too, or
      // could not (the database was locked or refused it): then it is stored from the file.
      // Its attempt_uid says which, whatever else reached the database meanwhile.
      db.write_run_if_new(*left);
      status = left->status;
      detail = left->failure ? left->failure->message
                             : fmt::format("loss {}", loss_text(left->final_loss));
    } else if (static_cast<int64_t>(db.statuses_of(run.run_id).size()) > a.stored_before) {
      // No record file but a new attempt stored (a child without --json support, or its
      // file removed): take the status from the database.
      const std::optional<RunRecord> record = db.latest_record(run.run_id);
      if (record) {
        status = record->status;
        detail = record->failure ? record->failure->message
                                 : fmt::format("loss {}", loss_text(record->final_loss));
      }
    } else {
      std::string message;
      const int code = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1;
      if (a.timed_out) {
        status = RunStatus::kStatusTimeout;
        message = fmt::format("stopped after {:.0f} s (run_timeout)", elapsed);
      } else if ((stopping && WIFSIGNALED(wait_status)) || code == kExitStopped) {
        // Stopped before its training began (exit 75 without a record), or with the sweep and
        // killed before it could record itself (its state, if it saved one, is whole).
        status = RunStatus::kStatusInterrupted;
        message = WIFSIGNALED(wait_status)
                      ? fmt::format("stopped with the sweep: killed by {}",
                                    signal_name(WTERMSIG(wait_status)))
                      : fmt::format("stopped before its training began (exit code {})", code);
      } else if (WIFSIGNALED(wait_status)) {
        const std::string tail = file_tail(a.log);
        status = o.memory_limit_bytes > 0 && looks_like_oom(tail) ? RunStatus::kStatusOom
                                                                  : RunStatus::kStatusCrashed;
        message = fmt::format("killed by {}", signal_name(WTERMSIG(wait_status)));
      } else {
        const std::string tail = file_tail(a.log);
        status = looks_like_oom(tail) ? RunStatus::kStatusOom
                 : code == 2          ? RunStatus::kStatusError
                                      : RunStatus::kStatusCrashed;
        message = fmt::format("exit code {}: {}", code, failure_message(a.log));
      }
      db.write_run(failure_record(run, sweep.name, status, message, a.log, a.started_at, elapsed,
                                  a.threads));
      detail = message;
    }
    std::error_code ec;
    fs::remove(a.result, ec);
    const bool stopped = status == RunStatus::kStatusInterrupted;
    // Kept for the next sweep to resume from; of no use once the run has any other status.
    if (!stopped) remove_train_state(a.state);
    run.previous.push_back(status);
    run.action = decide(run.previous, state_kept(o.log_dir, run.run_id, run.resolved.config.nproc));
    // An interrupted run was asked to stop: the next sweep resumes it, this one does not.
    const bool retry = run.pending() && !stopped;
    if (stopped) {
      ++left_interrupted;
    } else if (retry) {
      queue.push_front(a.index);
    } else {
      ++finished;
      finished_seconds += elapsed;
      if (!is_final_status(status)) ++failed;
    }
    const size_t left = queue.size() + active.size();  // `a` has left `active` already
    const double eta = finished > 0 ? finished_seconds / static_cast<double>(finished) *
                                          static_cast<double>(left) / static_cast<double>(jobs)
                                    : 0.0;
    const char* next = retry                    ? ", will retry once"
                       : !stopped               ? ""
                       : run.action == "resume" ? ", the next sweep resumes it"
                                                : ", the next sweep starts it again";
    fmt::print(out, "[{}/{}] {}: {} in {} ({}){}; done {}, failed {}, left {}{}\n", finished, total,
               run.label, status_name(status), format_duration(elapsed), terminal_text(detail),
               next, finished - failed, failed, left,
               finished > 0 && left > 0 && !stopping ? ", eta " + format_duration(eta) : "");
    std::fflush(out);
  };

  while ((!queue.empty() && !stopping) || !active.empty()) {
    if (stop_requested() && !stopping) {
      stopping = true;
      stop_started = std::chrono::steady_clock::now();
      fmt::print(out,
                 "stopping: {} running run{} asked to save and stop (up to {}), {} not "
                 "started\n",
                 active.size(), active.size() == 1 ? "" : "s", format_duration(o.stop_grace_s),
                 queue.size());
      std::fflush(out);
      for (const auto& [child_pid, a] : active) kill(child_pid, SIGTERM);
    }
    if (stopping && seconds_since(stop_started) > o.stop_grace_s)
      for (auto& [child_pid, a] : active) kill(child_pid, SIGKILL);
    while (!stopping && !queue.empty() && static_cast<int64_t>(active.size()) < jobs) {
      const size_t next = queue.front();
      queue.pop_front();
      launch(next);
    }
    int wait_status = 0;
    const pid_t pid = waitpid(-1, &wait_status, WNOHANG);
    if (pid > 0) {
      auto it = active.find(pid);
      if (it != active.end()) {
        Attempt attempt = std::move(it->second);
        active.erase(it);
        reap(attempt, wait_status);
      }
      continue;
    }
    for (auto& [child_pid, a] : active) {
      const double elapsed = seconds_since(a.started);
      if (o.run_timeout_s > 0 && elapsed > o.run_timeout_s && !a.timed_out) {
        a.timed_out = true;
        kill(child_pid, SIGKILL);
      }
      if (o.heartbeat_s > 0 && elapsed - a.last_heartbeat_s >= o.heartbeat_s) {
        a.last_heartbeat_s = elapsed;
        const std::string step = last_line_with(file_tail(a.log), "step ");
        fmt::print(out, "  ... {}: {} running{}\n", plan[a.index].label, format_duration(elapsed),
                   step.empty() ? "" : ", " + step);
        std::fflush(out);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // Runs the stop kept from starting (or from their retry) are left for the next sweep too.
  if (stopping) left_interrupted += static_cast<int64_t>(queue.size());
  if (interrupted) *interrupted = left_interrupted;
  return static_cast<int64_t>(failed);
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
