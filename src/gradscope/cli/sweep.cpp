// `gradscope sweep`: a grid of runs from a TOML file, each in a child process, resumable;
// `gradscope collect`: merges result files (cluster tasks) into a database.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "gradscope/cli/commands.h"
#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/log.h"
#include "gradscope/measure/contention.h"
#include "gradscope/store/db.h"
#include "gradscope/sweep/grid.h"
#include "gradscope/sweep/runner.h"
#include "gradscope/sweep/slurm.h"
#include "gradscope/train/train_state.h"

namespace gradscope {
namespace {

struct SweepCliOptions {
  std::string file;
  std::string db;
  int64_t jobs = 0;
  double run_timeout_s = 0;
  std::string memory_limit;
  bool dry_run = false;
  std::string emit;
  std::string out;
  SlurmSettings slurm;  // flags; each set one overrides the file's [slurm]
  bool submit = false;
  double submit_watch_s = 30;
  std::string log_dir;
  double heartbeat_s = 30;
  std::vector<std::string> only;  // run ids: the grid's runs to keep, the rest left alone
};

std::string self_executable() {
  std::error_code ec;
  const auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  check_usage(!ec, "cannot find the gradscope executable (/proc/self/exe): " + ec.message());
  return path.string();
}

void print_plan(const Sweep& sweep, const std::vector<PlannedRun>& plan) {
  size_t width = 3;
  for (const auto& p : plan) width = std::max(width, p.label.size());
  fmt::print("sweep {} ({}): {} runs{}\n", sweep.name, sweep.path, plan.size(),
             sweep.excluded > 0 ? fmt::format(", {} excluded", sweep.excluded) : "");
  fmt::print("  {:>4}  {:<{}}  {:<16}  {}\n", "#", "run", width, "run id", "action");
  size_t pending = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    const auto& p = plan[i];
    std::string why;
    if (!p.previous.empty()) {
      std::string list;
      for (const RunStatus s : p.previous)
        list += (list.empty() ? "" : ", ") + std::string(status_name(s));
      why = " (stored: " + list + ")";
    }
    fmt::print("  {:>4}  {:<{}}  {:<16}  {}{}\n", i + 1, terminal_text(p.label), width, p.run_id,
               p.action, why);
    if (p.pending()) ++pending;
  }
  fmt::print("{} to run, {} skipped\n", pending, plan.size() - pending);
}

// Timings taken while other tasks compete for the CPUs measure the queue as much as the work:
// each run records what competed with it (docs/metrics.md, "Disturbance"), and the sweep says
// so up front when the machine is busy before it starts.
void warn_if_busy() {
  const MachineLoad load = measure_machine_load();
  if (!load.measured || !load.busy) return;
  log_warn(
      "this machine is busy: {:.1f} runnable tasks on average besides this sweep (10 readings of "
      "/proc/stat's procs_running over 0.5 s; 1-minute load average {}) on its {} CPUs. Runs "
      "whose cores they take are marked disturbed in their records, and the report leaves their "
      "times out",
      load.other_tasks_mean,
      load.loadavg_1min ? fmt::format("{:.2f}", *load.loadavg_1min) : std::string("unknown"),
      load.cpus);
}

// How the sweep runs here: each flag given overrides the file's [sweep] setting.
SweepOptions run_options(const SweepCliOptions& o, const Sweep& sweep) {
  SweepOptions run;
  run.db_path =
      !o.db.empty() ? o.db : (!sweep.settings.db.empty() ? sweep.settings.db : "gradscope.db");
  run.jobs = o.jobs > 0 ? o.jobs : sweep.settings.jobs;
  run.run_timeout_s = o.run_timeout_s > 0 ? o.run_timeout_s : sweep.settings.run_timeout_s;
  run.memory_limit_bytes =
      !o.memory_limit.empty() ? parse_bytes(o.memory_limit) : sweep.settings.memory_limit_bytes;
  run.executable = self_executable();
  run.log_dir = !o.log_dir.empty() ? o.log_dir : run.db_path + ".logs";
  run.heartbeat_s = o.heartbeat_s;
  return run;
}

// The Slurm flags go with --emit slurm alone, and --emit's own with it.
void check_emit_flags(const SweepCliOptions& o) {
  const bool slurm_flags = o.submit || !o.slurm.partition.empty() || !o.slurm.account.empty() ||
                           !o.slurm.time.empty() || !o.slurm.mem.empty() ||
                           !o.slurm.gpus_per_task.empty() || o.slurm.cpus_per_task != 0;
  check_usage(!o.emit.empty() || !slurm_flags,
              "--submit, --partition, --account, --time, --mem, --gpus-per-task and "
              "--cpus-per-task go with --emit slurm",
              "add --emit slurm --out DIR, or drop them to run the sweep here");
  if (o.emit.empty()) return;
  check_usage(o.submit_watch_s >= 0 && o.submit_watch_s <= 3600,
              "--submit-watch must be between 0 and 3600 seconds");
  check_usage(o.only.empty(), "--only does not combine with --emit",
              "a cluster job runs the whole grid; run single runs here with --only");
  check_usage(o.emit == "slurm", "unknown --emit target '" + o.emit + "'", "valid: slurm");
  check_usage(!o.out.empty(), "--emit slurm needs --out DIR", "e.g. --out cluster/paper");
}

// --emit slurm: writes the job folder (and submits it with --submit) instead of running.
int emit_sweep(const SweepCliOptions& o, const Sweep& sweep, const SweepOptions& run) {
  SlurmSettings slurm = sweep.slurm;
  for (auto [flag, file] : {std::pair{&o.slurm.partition, &slurm.partition},
                            {&o.slurm.account, &slurm.account},
                            {&o.slurm.time, &slurm.time},
                            {&o.slurm.mem, &slurm.mem},
                            {&o.slurm.gpus_per_task, &slurm.gpus_per_task}})
    if (!flag->empty()) *file = *flag;
  if (o.slurm.cpus_per_task != 0) slurm.cpus_per_task = o.slurm.cpus_per_task;
  // Every run resolved (a bad one named) before anything is written.
  const std::vector<PlannedRun> plan = resolve_sweep(sweep, parse_run_arguments);
  const SlurmEmit emitted =
      emit_slurm(sweep, plan, o.out, run.executable, slurm, slurm_node_cpus(slurm.partition));
  for (const SlurmArray& array : emitted.arrays)
    fmt::print("wrote {}: {} array task{}{}\n", array.script, array.tasks.size(),
               array.tasks.size() == 1 ? "" : "s",
               array.nproc > 1 ? fmt::format(" of {} ranks each", array.nproc) : "");
  fmt::print("{}\n", emitted.note);
  if (o.submit) {
    submit_slurm(emitted, o.out, o.submit_watch_s, stdout);
  } else {
    for (const SlurmArray& array : emitted.arrays) fmt::print("submit: sbatch {}\n", array.script);
  }
  fmt::print("then: gradscope collect {} --db {}\n", o.out, run.db_path);
  return 0;
}

// --only: the runs of the plan with those ids, each once, in the order given.
std::vector<PlannedRun> only_runs(const std::vector<PlannedRun>& plan,
                                  const SweepCliOptions& o) {
  std::vector<PlannedRun> kept;
  for (const std::string& id : o.only) {
    const auto it = std::find_if(plan.begin(), plan.end(),
                                 [&](const PlannedRun& p) { return p.run_id == id; });
    check_usage(it != plan.end(),
                fmt::format("--only {}: no run of {} has that id", terminal_text(id), o.file),
                "the ids are in `gradscope sweep FILE --dry-run` and a report's runs.csv");
    if (std::none_of(kept.begin(), kept.end(),
                     [&](const PlannedRun& p) { return p.run_id == id; }))
      kept.push_back(*it);
  }
  return kept;
}

// Runs the plan here, holding the database's sweep lock, then prints the summary.
int run_here(const Sweep& sweep, std::vector<PlannedRun>& plan, SweepOptions& run) {
  Database db(run.db_path);
  std::optional<SweepLock> lock;  // held from the plan to the last stored record
  lock.emplace(run.db_path);
  decide_actions(plan, db, run.log_dir);
  warn_if_busy();
  int64_t interrupted = 0;
  // Held until the process ends: a signal while the sweep prints its summary and exits
  // changes neither (run_sweep's own handlers nest in these).
  const StopSignals stop_signals(StopSignals::Scope::kUntilExit);
  run.lock_fd = lock->fd();  // the children hold it too
  const int64_t failed = run_sweep(sweep, plan, db, run, &interrupted);
  fmt::print("\n{}", sweep_summary(plan, db));
  fmt::print("results: {} (sweep {}); logs: {}\n", run.db_path, sweep.name, run.log_dir);
  if (interrupted > 0) {
    fmt::print(
        "{} run{} left by the stop (interrupted, or not started): run the sweep again to "
        "finish {}\n",
        interrupted, interrupted == 1 ? "" : "s", interrupted == 1 ? "it" : "them");
    return kExitStopped;
  }
  return failed == 0 ? 0 : 1;
}

int execute_sweep(SweepCliOptions& o) {
  const Sweep sweep = load_sweep(o.file);
  SweepOptions run = run_options(o, sweep);
  const SelfExecutable binary;  // children start from this binary even if it is rebuilt
  run.executable_fd = binary.get();
  check_emit_flags(o);
  if (!o.emit.empty()) return emit_sweep(o, sweep, run);

  // Every run resolved and --only checked before the database is opened: a sweep refused
  // here creates no database and leaves an existing one as it was.
  std::vector<PlannedRun> plan = resolve_sweep(sweep, parse_run_arguments);
  if (!o.only.empty()) plan = only_runs(plan, o);
  // A dry run only reads: the database as it is, or none yet (an empty one in memory).
  if (o.dry_run) {
    std::error_code ec;
    const bool none = !std::filesystem::exists(run.db_path, ec) ||
                      std::filesystem::file_size(run.db_path, ec) == 0;
    Database db = none ? Database(":memory:")
                       : Database(run.db_path, DatabaseAccess::kReadOnly);
    decide_actions(plan, db, run.log_dir);
    print_plan(sweep, plan);
    return 0;
  }
  return run_here(sweep, plan, run);
}

}  // namespace

void add_sweep_command(CLI::App& root, int& exit_code) {
  auto o = std::make_shared<SweepCliOptions>();
  CLI::App* cmd = root.add_subcommand(
      "sweep",
      "Run a grid of configurations from a TOML file, each in its own process.\n"
      "Resumable: a run whose final record (ok, oom, diverged) is in the database is skipped;\n"
      "error, crashed and timeout are retried once; a run interrupted by SIGTERM or SIGINT\n"
      "resumes from its training state (docs/training-state.md). SIGTERM or SIGINT stops the\n"
      "sweep: its running runs save their state and are recorded interrupted. Flags override\n"
      "the file's [sweep] table. Exit 0 when every run ended in a final status, 75 when runs\n"
      "were left interrupted (run the sweep again to resume them).\n"
      "Example: gradscope sweep configs/sweeps/smoke.toml --jobs 2\n"
      "File format: docs/sweeps.md");
  cmd->add_option("file", o->file, "Sweep file (TOML)")->required();
  cmd->add_option("--db", o->db, "Results database (default: the file's, else gradscope.db)");
  cmd->add_option("--jobs", o->jobs,
                  "Runs at a time (CPU threads are split between them; "
                  "with CUDA, one run per GPU)");
  cmd->add_option("--run-timeout", o->run_timeout_s,
                  "Seconds after which a run is stopped and recorded as timeout");
  cmd->add_option("--memory-limit", o->memory_limit,
                  "Address-space limit of each run (e.g. 8GiB); a run past it is recorded as oom");
  cmd->add_flag("--dry-run", o->dry_run, "List the runs and what would happen to each; run none");
  cmd->add_option("--emit", o->emit, "Write a cluster job instead of running: slurm");
  cmd->add_option("--out", o->out, "With --emit: the folder to write the job into");
  cmd->add_option("--cpus-per-task", o->slurm.cpus_per_task,
                  "With --emit slurm: CPUs of each rank (default: min(4, the largest node's "
                  "CPUs / the run's ranks), by sinfo; 0 = that default)");
  cmd->add_option("--partition", o->slurm.partition, "With --emit slurm: the partition(s)");
  cmd->add_option("--account", o->slurm.account, "With --emit slurm: the account to charge");
  cmd->add_option("--time", o->slurm.time,
                  "With --emit slurm: each task's time limit (90, 02:00:00, 1-12:00:00); "
                  "default: run_timeout + 5 minutes, else the partition's");
  cmd->add_option("--mem", o->slurm.mem,
                  "With --emit slurm: memory per node, which a run's ranks share (16G); "
                  "default: memory_limit x the run's ranks, else the cluster's");
  cmd->add_option("--gpus-per-task", o->slurm.gpus_per_task,
                  "With --emit slurm: GPUs per rank (1, or a100:1); default 1 for CUDA runs");
  cmd->add_flag("--submit", o->submit,
                "With --emit slurm: submit the job (sbatch --test-only first) and report "
                "tasks that cannot start");
  cmd->add_option("--submit-watch", o->submit_watch_s,
                  "With --submit: seconds to watch the queued tasks for a reason they can "
                  "never start")
      ->capture_default_str();
  cmd->add_option("--log-dir", o->log_dir, "Where each attempt's output goes (default: DB.logs)");
  cmd->add_option("--only", o->only,
                  "Run only the run with this id (repeatable; ids as --dry-run lists them), "
                  "e.g. to run one configuration of a grid again into a database of its own")
      ->allow_extra_args(false);
  cmd->add_option("--heartbeat", o->heartbeat_s,
                  "Seconds between progress reports of a long run (0 = none)")
      ->capture_default_str();
  cmd->callback([o, &exit_code] { exit_code = execute_sweep(*o); });
}

void add_collect_command(CLI::App& root, int& exit_code) {
  auto dir = std::make_shared<std::string>();
  auto db_path = std::make_shared<std::string>("gradscope.db");
  CLI::App* cmd = root.add_subcommand(
      "collect",
      "Merge result files (written by `gradscope run --json`, e.g. by the tasks of\n"
      "`gradscope sweep --emit slurm`) into a database. Each attempt is stored once, so\n"
      "collecting again, or while tasks still run, is safe. A file that is not a run record\n"
      "is named and skipped, the others are merged, and the exit code is 2.\n"
      "Example: gradscope collect cluster/paper --db results.db");
  cmd->add_option("dir", *dir, "Folder of result files (or the --out folder of --emit slurm)")
      ->required();
  cmd->add_option("--db", *db_path, "Results database")->capture_default_str();
  cmd->callback([dir, db_path, &exit_code] {
    Database db(*db_path);
    const CollectReport r = collect_results(*dir, db);
    fmt::print("merged {} result file{} into {}, {} already there\n", r.merged,
               r.merged == 1 ? "" : "s", *db_path, r.present);
    auto task_list = [](const std::vector<std::string>& tasks) {
      std::string list;
      for (size_t i = 0; i < tasks.size() && i < 20; ++i) list += (i ? " " : "") + tasks[i];
      return list + (tasks.size() > 20 ? " ..." : "");
    };
    if (r.expected >= 0) {
      fmt::print("{} of {} tasks have a final record\n",
                 r.expected - static_cast<int64_t>(r.missing.size() + r.interrupted.size()),
                 r.expected);
      if (!r.interrupted.empty())
        fmt::print("interrupted, not yet finished (a requeue resumes them): {}\n",
                   task_list(r.interrupted));
      if (!r.missing.empty()) fmt::print("without a result yet: {}\n", task_list(r.missing));
    }
    if (!r.runs_file_error.empty())
      fmt::print(stderr,
                 "error: {}\nhint: the tasks cannot be counted; the result files were "
                 "merged\n",
                 terminal_text(r.runs_file_error));
    for (const std::string& refused : r.refused)
      fmt::print(stderr, "refused: {}\n", terminal_text(refused));
    if (!r.refused.empty())
      fmt::print(stderr,
                 "error: {} file{} not merged: not run records\n"
                 "hint: collect reads the files `gradscope run --json` writes{}\n",
                 r.refused.size(), r.refused.size() == 1 ? " was" : "s were",
                 r.merged + r.present > 0 ? "; the others are in the database" : "");
    exit_code = r.refused.empty() && r.runs_file_error.empty() ? 0 : 2;
  });
}

}  // namespace gradscope
