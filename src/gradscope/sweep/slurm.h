// A sweep as Slurm job arrays (`gradscope sweep --emit slurm`) and what each array task runs
// (`gradscope task`).
//
// The emitted folder:
//   runs.json          every run of the grid: its index, id, label, ranks and `gradscope run`
//                      arguments (JSON: data, never read by a shell)
//   sweep.sbatch       the job array of the one-rank runs; sweep-nN.sbatch that of the runs of
//                      N ranks (one Slurm task per rank, started with srun)
//   results/           task-I.json, the record of run I (task-I.rK.json after K requeues)
//   state/             task-I, the training state of run I, saved when Slurm stops the task
//   logs/              task-I.log, what the task printed (appended over its requeues)
// A script holds no value of the grid: each array task runs `gradscope task DIR I`, which
// reads run I from runs.json and starts `gradscope run` with those arguments as an argument
// vector. What the scripts do hold (the folder, the executable, the #SBATCH values) is quoted
// for the shell or checked to be plain (check_slurm_setting, checked_job_folder).
//
// Preemption: the jobs are requeueable. Slurm sends SIGTERM to a task it preempts or requeues;
// the run saves its training state into state/task-I and records itself interrupted; the
// requeued task finds the state and resumes it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "gradscope/sweep/grid.h"
#include "gradscope/sweep/runner.h"

namespace gradscope {

// A command's exit code and output, run without a shell (each stream's first MiB).
struct CommandOutput {
  int code = -1;       // -1 when it could not start, was killed or ran past its time
  std::string output;  // stdout
  std::string errors;  // stderr
};
CommandOutput run_command(const std::vector<std::string>& argv, double timeout_s);

// The most CPUs a node of `partition` (the default partition when empty) has, from sinfo;
// nullopt when sinfo is missing or does not answer (not on a cluster's login node).
std::optional<int64_t> slurm_node_cpus(const std::string& partition);

struct SlurmArray {
  std::string script;         // its path
  int64_t nproc = 1;          // ranks (Slurm tasks) of each array task
  std::vector<size_t> tasks;  // the indices of runs.json it runs
  int64_t cpus_per_task = 0;  // written; 0 when left to the cluster (one CPU)
};

struct SlurmEmit {
  std::vector<SlurmArray> arrays;
  std::string note;  // how the CPUs were chosen
};

// Writes the folder above for the runs of `plan` (resolved, so every run is known valid
// before anything is written). `node_cpus` is what slurm_node_cpus said: without
// slurm.cpus_per_task, each rank asks for min(4, node_cpus / ranks) CPUs (at least one), so
// a run's ranks fit one node, or leaves it to the cluster when node_cpus is unknown; an
// explicit count above node_cpus is a usage error (the job could never start).
SlurmEmit emit_slurm(const Sweep& sweep, const std::vector<PlannedRun>& plan,
                     const std::string& dir, const std::string& executable,
                     const SlurmSettings& slurm, std::optional<int64_t> node_cpus);

// Submits the arrays with sbatch: first `sbatch --test-only` (a job Slurm would refuse is a
// usage error quoting sbatch), then for real; the job ids are appended to DIR/jobs.txt. Then
// watches the tasks for up to `watch_s` seconds: a task pending for a reason that waiting
// cannot cure (PartitionConfig, PartitionTimeLimit, InvalidAccount, ...) cancels what was
// submitted and is a usage error naming it; else prints where the tasks stand. Returns the
// job ids.
std::vector<std::string> submit_slurm(const SlurmEmit& emitted, const std::string& dir,
                                      double watch_s, std::FILE* out);

// One run of runs.json.
struct TaskRun {
  int64_t index = 0;
  std::string run_id;
  std::string label;
  int64_t nproc = 1;
  bool sets_threads = false;  // the run's own `threads` setting
  std::vector<std::string> args;
};

struct RunsFile {
  std::string sweep;
  std::vector<TaskRun> runs;
};

// Reads DIR/runs.json; a usage error naming the file and the item for anything that is not
// what emit_slurm writes (size, depth, types, an argument with a control character).
RunsFile read_runs_file(const std::string& dir);

// What array task `index` of DIR starts, given Slurm's variables: the arguments after
// `gradscope` ("run", ...), its result file, its state folder and whether it resumes.
struct TaskLaunch {
  std::vector<std::string> args;
  std::string result;
  std::string state;      // the run's --save-state folder
  std::string own_state;  // this rank's part of it (the folder itself with one rank)
  bool resume = false;    // every rank's part holds a state of this build at one step
  std::string why;        // when a state was found and not resumed: why
};
TaskLaunch plan_task(const std::string& dir, int64_t index);

// The result files of task `index` in `names` (file names of results/): task-I.json and
// task-I.rK.json.
bool is_task_result(const std::string& name, int64_t index);

}  // namespace gradscope
