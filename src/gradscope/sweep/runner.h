// Running a sweep: every run of the grid in a `gradscope run` child process of its own, so
// that its memory peak is clean and a crash, a kill or a hang costs that run alone.
//
// Never losing a run, never running one twice:
// - A run's id is known before it starts (run_id_for), so the database says what is done.
//   ok, oom and diverged are final; error, crashed and timeout are retried once (two failed
//   attempts in all, across invocations); a run with no attempt (never started, or killed
//   before its record was written) runs. A run whose last attempt is interrupted (stopped by
//   SIGTERM or SIGINT) is resumed from its training state when it has one, else started
//   again; an interrupted attempt is not a failed one.
// - The child writes its record in one transaction at its end; the parent writes a record
//   only for a child that ended without one (killed by a signal: crashed; past run_timeout:
//   timeout; out of memory under memory_limit: oom).
// - Each child keeps its training state in LOG_DIR/RUN_ID.state (--save-state), saved when
//   it is stopped; the folder is removed once the run has another status than interrupted.
// - On SIGTERM or SIGINT the sweep forwards SIGTERM to its children and waits for them (at
//   most stop_grace_s, then SIGKILL): each saves its state and records itself interrupted.
//   Children get SIGTERM when the sweep dies (PR_SET_PDEATHSIG): each saves its state and
//   records itself interrupted. Each child holds the sweep's lock too (the same open file),
//   so until the last of them has ended no new sweep starts on the database: none starts a
//   run again while an orphan of a killed sweep is still finishing it.
// - A run with a training state kept and no final status is resumed, whatever its last
//   status says (a child may save its state and die before it records itself).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gradscope/core/config.h"
#include "gradscope/core/record.h"
#include "gradscope/store/db.h"
#include "gradscope/sweep/grid.h"
#include "gradscope/train/session.h"

namespace gradscope {

// Turns a run's `gradscope run` arguments into its configuration (the CLI's own parser).
using RunArgumentParser = std::function<RunConfig(const std::vector<std::string>& args)>;

struct PlannedRun {
  RunSpec spec;
  ResolvedRun resolved;  // its configuration, resolved as the run will resolve it, and run id
  std::string run_id;
  std::string label;
  std::vector<RunStatus> previous;  // statuses of the attempts already stored
  // "run" (no attempt yet, or an interrupted one without a state), "retry" (one failed
  // attempt), "resume" (the last attempt was interrupted and its training state is kept),
  // "done" (a final status is stored), "given up" (two failed attempts).
  std::string action;
  bool pending() const { return action == "run" || action == "retry" || action == "resume"; }
};

// Resolves every run of the grid (a usage error names the first bad one, or two runs of one
// id); previous and action are left empty.
std::vector<PlannedRun> resolve_sweep(const Sweep& sweep, const RunArgumentParser& parse);

// Decides, for runs resolve_sweep resolved, what each needs: from the database and the training
// states kept in `log_dir` (run_state_folder).
void decide_actions(std::vector<PlannedRun>& plan, Database& db, const std::string& log_dir = "");

// Resolves every run of the grid (a usage error names the first bad one) and decides, from
// the database and the training states kept in `log_dir` (run_state_folder), what each needs.
std::vector<PlannedRun> plan_sweep(const Sweep& sweep, Database& db, const RunArgumentParser& parse,
                                   const std::string& log_dir = "");

// The folder in which the sweep's children of run `run_id` keep its training state
// (--save-state; docs/training-state.md): LOG_DIR/RUN_ID.state.
std::string run_state_folder(const std::string& log_dir, const std::string& run_id);

// The record the sweep stores for an attempt that ended without its own (crashed, killed,
// past its run_timeout, out of its memory_limit): the run's identity and its configuration
// resolved as the run resolves it (so the report files it with the run's other attempts and
// seeds), the status and the failure, the attempt's elapsed time; nothing else was measured.
// `threads`: the --threads the sweep gave the child (0: none).
RunRecord failure_record(const PlannedRun& run, const std::string& sweep, RunStatus status,
                         const std::string& message, const std::string& log,
                         const std::string& started_at, double elapsed_s, int64_t threads);

// The name (without extension) of an attempt's log and result files in log_dir: RUN_ID-N
// with the first N from `counter` on at which neither RUN_ID-N.log nor RUN_ID-N.json exists,
// so that a resumed sweep never overwrites an earlier attempt's files (a failure record
// points at its log). The log is created empty to claim the name (another sweep sharing
// the folder skips it). Advances `counter` past the N it returns.
std::string free_attempt_stem(const std::string& log_dir, const std::string& run_id, int& counter);

struct SweepOptions {
  std::string db_path;
  int64_t jobs = 1;
  double run_timeout_s = 0;        // 0 = none
  int64_t memory_limit_bytes = 0;  // address-space limit of each child; 0 = none
  std::string executable;          // the gradscope binary the children run (its path)
  int executable_fd = -1;          // an open descriptor of it; children start from it when set
  std::string log_dir;             // children's output (one log per attempt)
  std::FILE* out = stdout;         // progress and summary
  double heartbeat_s = 30;         // how often to report a long run's progress
  // After SIGTERM or SIGINT, how long the children may take to save their state and record
  // themselves before they are killed.
  double stop_grace_s = 120;
  // The sweep's lock (SweepLock::fd): each child holds it too, so that it lasts until the
  // last child ends; -1 for none.
  int lock_fd = -1;
};

// The sweep's hold on its database: one sweep at a time per database file, so that two never
// run the same pending runs or take each other's records. An advisory lock (flock) on
// DB.sweep-lock beside the database, released when the sweep ends however it ends; the
// file says who holds it. A second sweep gets a usage error naming the holder. The lock file
// stays (it is empty of meaning once unlocked).
class SweepLock {
 public:
  explicit SweepLock(const std::string& db_path);
  ~SweepLock();
  SweepLock(const SweepLock&) = delete;
  SweepLock& operator=(const SweepLock&) = delete;
  // The locked descriptor (close-on-exec): a child that inherits it (SweepOptions::lock_fd)
  // holds the lock until it ends.
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

// A descriptor of the running executable (/proc/self/exe), so that children start from
// the very binary the sweep runs even if its file is replaced or removed meanwhile (a
// rebuild). Closed on destruction; get() is -1 where /proc is missing.
class SelfExecutable {
 public:
  SelfExecutable();
  ~SelfExecutable();
  SelfExecutable(const SelfExecutable&) = delete;
  SelfExecutable& operator=(const SelfExecutable&) = delete;
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

// Runs the pending runs of `plan` (updating their statuses) and prints progress. Returns the
// number of runs that ended without a final status (error, crashed or timeout twice). `db` is
// the database at options.db_path, the one the children write to: a process must keep one
// connection per database file (see store/db.h). SIGTERM or SIGINT stops the sweep: no run
// starts any more, the running ones are stopped (SweepOptions::stop_grace_s) and recorded
// interrupted. `interrupted`, when given, receives the number of runs the stop left for the
// next sweep: those recorded interrupted and those it kept from starting.
int64_t run_sweep(const Sweep& sweep, std::vector<PlannedRun>& plan, Database& db,
                  const SweepOptions& options, int64_t* interrupted = nullptr);

// The table printed after a sweep: one row per run with its latest attempt.
std::string sweep_summary(const std::vector<PlannedRun>& plan, Database& db);

struct CollectReport {
  int64_t merged = 0;                // result files stored now
  int64_t present = 0;               // result files whose attempt was already stored
  int64_t expected = -1;             // tasks listed in runs.json, -1 without one
  std::vector<std::string> missing;  // tasks of runs.json without a result file that is a record
  // Tasks whose every record says interrupted: stopped (preempted, requeued) and not yet
  // finished by a later attempt.
  std::vector<std::string> interrupted;
  std::string runs_file_error;       // why runs.json could not be read, when it could not
  std::vector<std::string> refused;  // "FILE: why" for each file that is not a run record
};

// The run record in a result file (`gradscope run --json`): nullopt, with the reason in *why,
// when the file is too large, not JSON, nests too deep, does not follow the typed record or
// has no attempt_uid.
std::optional<RunRecord> read_result_file(const std::string& path, std::string* why);

// Merges the result files of `dir` (results/*.json, or *.json in dir itself) into the
// database, each attempt once. A file that is not a run record is named in `refused` and
// skipped; the others are merged.
CollectReport collect_results(const std::string& dir, Database& db);

}  // namespace gradscope
