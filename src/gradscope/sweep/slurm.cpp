#include "gradscope/sweep/slurm.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/files.h"
#include "gradscope/core/json_input.h"
#include "gradscope/core/log.h"
#include "gradscope/core/plain_text.h"
#include "gradscope/train/train_state.h"

namespace gradscope {
namespace fs = std::filesystem;
namespace {

constexpr const char* kRunsFormat = "gradscope-slurm-runs";
constexpr int kRunsVersion = 1;
constexpr int64_t kMaxRunsFileBytes = 256LL << 20;

std::string quoted_for_shell(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The job folder goes into #SBATCH --output, which sbatch reads with its own rules (spaces
// split, '%' is a pattern) before any shell: only characters that mean nothing there.
std::string checked_job_folder(const std::string& dir) {
  check_usage(!dir.empty(), "--emit slurm needs --out DIR", "e.g. --out cluster/paper");
  const std::string path = fs::absolute(dir).lexically_normal().string();
  for (char c : path) {
    const bool plain = std::isalnum(static_cast<unsigned char>(c)) != 0 ||
                       std::string_view("/._-+,=@~").find(c) != std::string_view::npos;
    check_usage(plain,
                fmt::format("--out {}: the job folder's path holds '{}', which an #SBATCH line "
                            "cannot carry",
                            terminal_text(dir), terminal_text(std::string(1, c))),
                "choose a folder whose path has letters, digits and / . _ - + , = @ ~ alone");
  }
  check_usage(path.size() <= 1024, "--out: the job folder's path is over 1024 characters");
  return path;
}

// "0-3,5,7-8" for sorted indices: Slurm's --array syntax.
std::string index_ranges(const std::vector<size_t>& indices) {
  std::string out;
  for (size_t i = 0; i < indices.size();) {
    size_t j = i;
    while (j + 1 < indices.size() && indices[j + 1] == indices[j] + 1) ++j;
    out += (out.empty() ? "" : ",") +
           (j == i ? std::to_string(indices[i]) : fmt::format("{}-{}", indices[i], indices[j]));
    i = j + 1;
  }
  return out;
}

// A count Slurm sets (a job id, a rank, a requeue count, CPUs); nullopt outside a job.
std::optional<int64_t> env_count(const char* name) {
  return env_integer(name, 0, (1LL << 31) - 1,
                     "Slurm sets it to a non-negative integer; unset it outside a job");
}

std::string script_text(const Sweep& sweep, const std::string& root, const std::string& exe,
                        const SlurmArray& array, const std::string& directives) {
  const std::string ranks =
      array.nproc > 1 ? fmt::format(" ({} ranks each, one Slurm task per rank)", array.nproc) : "";
  const std::string start =
      array.nproc > 1
          ? fmt::format(
                "exec srun --ntasks={}{} --kill-on-bad-exit=1 \"$GRADSCOPE\" task \"$DIR\" "
                "\"$TASK\"",
                array.nproc,
                array.cpus_per_task > 0 ? fmt::format(" --cpus-per-task={}", array.cpus_per_task)
                                        : "")
          : std::string("exec \"$GRADSCOPE\" task \"$DIR\" \"$TASK\"");
  // clang-format off
  return fmt::format(R"SH(#!/bin/bash
# gradscope sweep {name}: {n} of the {total} runs of {root}/runs.json{ranks},
# one array task per run. Submit with `sbatch {path}`.
# Task I runs `gradscope task {root} I`: run I of runs.json, its record in
# results/task-I.json, its training state in state/task-I (saved when Slurm stops or requeues
# the task, resumed when it starts again). Merge the records as often as you like:
#   gradscope collect {root} --db DB
{directives}
set -euo pipefail
default_gradscope={exe}
GRADSCOPE="${{GRADSCOPE:-$default_gradscope}}"
DIR={qroot}
TASK="${{SLURM_ARRAY_TASK_ID:?set SLURM_ARRAY_TASK_ID (sbatch does)}}"
{start}
)SH",
      fmt::arg("name", sweep.name), fmt::arg("n", array.tasks.size()),
      fmt::arg("total", sweep.runs.size()), fmt::arg("root", root), fmt::arg("ranks", ranks),
      fmt::arg("path", array.script), fmt::arg("directives", directives),
      fmt::arg("exe", quoted_for_shell(exe)), fmt::arg("qroot", quoted_for_shell(root)),
      fmt::arg("start", start));
  // clang-format on
}

// "the default partition" or "partition NAME", for messages.
std::string partition_text(const SlurmSettings& slurm) {
  return slurm.partition.empty() ? "the default partition" : "partition " + slurm.partition;
}

// The names that go into the scripts: the sweep's and the executable's path.
void check_script_names(const Sweep& sweep, const std::string& executable) {
  check_usage(is_plain_name(sweep.name, 64),
              fmt::format("the sweep name '{}' is not a plain name", terminal_text(sweep.name)),
              "write name = \"...\" with letters, digits, '.', '_' or '-'");
  check_usage(!executable.empty() && !has_control_character(executable),
              "the gradscope executable's path holds a control character",
              "install gradscope under a plain path");
}

// The resources asked for, each of the form Slurm takes.
void check_resources(const SlurmSettings& slurm) {
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"partition", slurm.partition},
                                                        {"account", slurm.account},
                                                        {"time", slurm.time},
                                                        {"mem", slurm.mem},
                                                        {"gpus_per_task", slurm.gpus_per_task}})
    if (!value.empty()) check_slurm_setting(key, value);
  check_usage(slurm.cpus_per_task >= 0,
              fmt::format("--cpus-per-task {} must be at least 1", slurm.cpus_per_task));
}

// The checks against the cluster's largest node (`node_cpus`, from sinfo): the CPUs asked
// for per task, and each run's ranks, which share one node (--nodes=1), a CPU each at least.
void check_node_fit(const std::vector<PlannedRun>& plan, const SlurmSettings& slurm,
                    std::optional<int64_t> node_cpus) {
  check_usage(!node_cpus || slurm.cpus_per_task <= *node_cpus,
              fmt::format("--cpus-per-task {}: no node of {} has that many CPUs (the largest "
                          "has {}); the job could never start",
                          slurm.cpus_per_task, partition_text(slurm), node_cpus.value_or(0)),
              fmt::format("ask for at most {} (or leave it out: gradscope fits it)",
                          node_cpus.value_or(0)));
  for (size_t i = 0; node_cpus && i < plan.size(); ++i) {
    const int64_t nproc = std::max<int64_t>(1, plan[i].resolved.config.nproc);
    check_usage(nproc <= *node_cpus,
                fmt::format("run {} ({}) has {} ranks, but the largest node of {} has {} CPUs; "
                            "its ranks share one node, so the job could never start",
                            i, terminal_text(plan[i].label), nproc, partition_text(slurm),
                            *node_cpus),
                "use fewer ranks (nproc), or a partition of larger nodes");
  }
}

// How the CPUs per task were chosen, for the line emit prints.
std::string cpus_note(const SlurmSettings& slurm, std::optional<int64_t> node_cpus) {
  if (slurm.cpus_per_task > 0)
    return fmt::format("{} CPUs per task, as asked", slurm.cpus_per_task);
  if (node_cpus)
    return fmt::format(
        "CPUs per task: up to 4, a run's ranks within the largest node's {} (sinfo)", *node_cpus);
  return fmt::format(
      "CPUs per task left to the cluster (one by default): sinfo named no node{} here; pass "
      "--cpus-per-task N",
      slurm.partition.empty() ? "" : " of partition " + slurm.partition);
}

// CPUs per rank: as asked; else up to 4 with a run's ranks on one node; else the cluster's
// choice (0).
int64_t cpus_per_rank(const SlurmSettings& slurm, std::optional<int64_t> node_cpus,
                      int64_t nproc) {
  if (slurm.cpus_per_task > 0) return slurm.cpus_per_task;
  if (node_cpus) return std::max<int64_t>(1, std::min<int64_t>(4, *node_cpus / nproc));
  return 0;
}

// The runs of runs.json, grouped by their ranks (an array's tasks all ask for the same
// resources), and whether any runs on CUDA (then each task asks for a GPU).
struct EmittedRuns {
  nlohmann::json runs = nlohmann::json::array();
  std::map<int64_t, std::vector<size_t>> by_nproc;
  bool cuda = false;
};

EmittedRuns emitted_runs(const Sweep& sweep, const std::vector<PlannedRun>& plan) {
  EmittedRuns out;
  for (size_t i = 0; i < plan.size(); ++i) {
    const PlannedRun& p = plan[i];
    const RunConfig& c = p.resolved.config;
    out.by_nproc[std::max<int64_t>(1, c.nproc)].push_back(i);
    out.cuda = out.cuda || c.device.rfind("cuda", 0) == 0;
    // Under Slurm a run past run_timeout must record timeout itself, as a local sweep's
    // does, before Slurm's own limit (run_timeout + 5 minutes) stops it.
    std::vector<std::string> args = p.spec.args();
    if (sweep.settings.run_timeout_s > 0 && !p.spec.values.count("timeout")) {
      args.push_back("--timeout");
      args.push_back(fmt::format("{}", sweep.settings.run_timeout_s));
    }
    out.runs.push_back({{"index", i},
                        {"run_id", p.run_id},
                        {"label", p.label},
                        {"nproc", std::max<int64_t>(1, c.nproc)},
                        {"sets_threads", p.spec.values.count("threads") > 0},
                        {"args", args}});
  }
  return out;
}

// The #SBATCH lines every array of the sweep shares: its name, log files, requeue, and the
// partition, account, time and GPUs asked for.
std::string common_directives(const Sweep& sweep, const std::string& root,
                              const SlurmSettings& slurm, bool cuda) {
  std::string common = fmt::format("#SBATCH --job-name=gradscope-{}\n", sweep.name);
  common += fmt::format("#SBATCH --output={}/logs/task-%a.log\n", root);
  common += "#SBATCH --open-mode=append\n#SBATCH --requeue\n";
  if (!slurm.partition.empty()) common += "#SBATCH --partition=" + slurm.partition + "\n";
  if (!slurm.account.empty()) common += "#SBATCH --account=" + slurm.account + "\n";
  if (!slurm.time.empty())
    common += "#SBATCH --time=" + slurm.time + "\n";
  else if (sweep.settings.run_timeout_s > 0)
    common += fmt::format("#SBATCH --time={}\n",
                          static_cast<int64_t>(std::ceil(sweep.settings.run_timeout_s / 60.0)) + 5);
  const std::string gpus = !slurm.gpus_per_task.empty() ? slurm.gpus_per_task : cuda ? "1" : "";
  if (!gpus.empty()) common += "#SBATCH --gpus-per-task=" + gpus + "\n";
  return common;
}

// One array's #SBATCH lines: the common ones, its tasks, its ranks, CPUs and memory.
std::string array_directives(const std::string& common, const SlurmArray& array,
                             const Sweep& sweep, const SlurmSettings& slurm) {
  std::string d = common + "#SBATCH --array=" + index_ranges(array.tasks) + "\n";
  // A run's ranks on one node: the CPUs and memory asked for are sized for that.
  if (array.nproc > 1) d += fmt::format("#SBATCH --nodes=1\n#SBATCH --ntasks={}\n", array.nproc);
  if (array.cpus_per_task > 0)
    d += fmt::format("#SBATCH --cpus-per-task={}\n", array.cpus_per_task);
  // --mem is per node: the ranks of a run share it.
  if (!slurm.mem.empty())
    d += "#SBATCH --mem=" + slurm.mem + "\n";
  else if (sweep.settings.memory_limit_bytes > 0)
    d += fmt::format("#SBATCH --mem={}M\n",
                     array.nproc * ((sweep.settings.memory_limit_bytes + (1 << 20) - 1) >> 20));
  d.pop_back();  // the template ends the line
  return d;
}

// Tasks of an earlier emit still queued would read the new runs.json and run other runs
// into the same result files: a folder holds one grid.
void check_folder_holds_grid(const std::string& root, const std::vector<PlannedRun>& plan) {
  std::error_code ec;
  if (!fs::exists(root + "/runs.json", ec)) return;
  bool same = false;
  try {
    const RunsFile before = read_runs_file(root);
    same = before.runs.size() == plan.size();
    for (size_t i = 0; same && i < plan.size(); ++i)
      same = before.runs[i].run_id == plan[i].run_id;
  } catch (const Error&) {
  }
  check_usage(
      same, fmt::format("{} holds the job of another grid (its runs.json lists other runs)", root),
      "choose a new --out folder; remove that one only once its jobs have ended and "
      "its results are collected");
}

// A script of an earlier emit for ranks this grid no longer has would run stale indices.
void remove_stale_scripts(const std::string& root, const std::vector<SlurmArray>& arrays) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name == "sweep.sbatch" ||
                      (name.rfind("sweep-n", 0) == 0 && entry.path().extension() == ".sbatch");
    if (ours && std::none_of(arrays.begin(), arrays.end(), [&](const SlurmArray& a) {
          return a.script == entry.path().string();
        }))
      fs::remove(entry.path(), ec);
  }
}

}  // namespace

SlurmEmit emit_slurm(const Sweep& sweep, const std::vector<PlannedRun>& plan,
                     const std::string& dir, const std::string& executable,
                     const SlurmSettings& slurm, std::optional<int64_t> node_cpus) {
  check_usage(!plan.empty(), "the sweep has no runs to emit");
  check_script_names(sweep, executable);
  const std::string root = checked_job_folder(dir);
  check_resources(slurm);
  check_node_fit(plan, slurm, node_cpus);
  SlurmEmit emitted;
  emitted.note = cpus_note(slurm, node_cpus);

  const EmittedRuns runs = emitted_runs(sweep, plan);
  const std::string common = common_directives(sweep, root, slurm, runs.cuda);
  for (const auto& [nproc, tasks] : runs.by_nproc) {
    SlurmArray array;
    array.nproc = nproc;
    array.tasks = tasks;
    array.cpus_per_task = cpus_per_rank(slurm, node_cpus, nproc);
    array.script =
        root + "/" +
        (nproc == 1 ? std::string("sweep.sbatch") : fmt::format("sweep-n{}.sbatch", nproc));
    emitted.arrays.push_back(std::move(array));
  }

  check_folder_holds_grid(root, plan);
  std::error_code ec;
  for (const char* sub : {"results", "logs", "state"})
    fs::create_directories(fs::path(root) / sub, ec);
  check_usage(!ec && fs::is_directory(fs::path(root) / "state"),
              fmt::format("cannot create the job folder {}: {}", root, ec.message()),
              "choose a writable --out folder");
  const nlohmann::json file = {{"format", kRunsFormat},
                               {"version", kRunsVersion},
                               {"sweep", sweep.name},
                               {"source", sweep.path},
                               {"runs", runs.runs}};
  write_file_atomically(root + "/runs.json", file.dump(1) + "\n");
  for (const SlurmArray& array : emitted.arrays) {
    const std::string directives = array_directives(common, array, sweep, slurm);
    write_file_atomically(array.script, script_text(sweep, root, executable, array, directives));
    fs::permissions(array.script, fs::perms::owner_exec | fs::perms::group_exec,
                    fs::perm_options::add, ec);
  }
  remove_stale_scripts(root, emitted.arrays);
  return emitted;
}

RunsFile read_runs_file(const std::string& dir) {
  const std::string path = (fs::path(dir) / "runs.json").string();
  const std::string hint = "pass the --out folder of `gradscope sweep --emit slurm`";
  const nlohmann::json j =
      parse_json_input(read_input_file(path, "runs file", kMaxRunsFileBytes), path, hint);
  auto bad = [&](const std::string& what) {
    fail_usage(fmt::format("{}: {}", path, what), "emit the job again: " + hint);
  };
  if (!j.is_object() || !j.contains("format") || !j["format"].is_string() ||
      j["format"].get<std::string>() != kRunsFormat)
    bad(fmt::format("not a gradscope runs file (\"format\": \"{}\")", kRunsFormat));
  if (!j.contains("version") || !j["version"].is_number_integer() ||
      j["version"].get<int64_t>() != kRunsVersion)
    bad(fmt::format("version {} is not {}", json_preview(j.value("version", nlohmann::json())),
                    kRunsVersion));
  RunsFile file;
  if (!j.contains("sweep") || !j["sweep"].is_string() ||
      !is_plain_name(j["sweep"].get<std::string>(), 64))
    bad("\"sweep\" is not a plain name");
  file.sweep = j["sweep"].get<std::string>();
  if (!j.contains("runs") || !j["runs"].is_array()) bad("\"runs\" is not an array");
  const auto& runs = j["runs"];
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& r = runs[i];
    const std::string at = fmt::format("run {}", i);
    if (!r.is_object()) bad(at + " is not an object");
    TaskRun t;
    if (!r.contains("index") || !r["index"].is_number_integer() ||
        r["index"].get<int64_t>() != static_cast<int64_t>(i))
      bad(at + ": \"index\" is not " + std::to_string(i));
    t.index = static_cast<int64_t>(i);
    for (const char* key : {"run_id", "label"})
      if (!r.contains(key) || !r[key].is_string() ||
          has_control_character(r[key].get<std::string>()))
        bad(fmt::format("{}: \"{}\" is not one line of text", at, key));
    t.run_id = r["run_id"].get<std::string>();
    t.label = r["label"].get<std::string>();
    if (!r.contains("nproc") || !r["nproc"].is_number_integer() || r["nproc"].get<int64_t>() < 1 ||
        r["nproc"].get<int64_t>() > 4096)
      bad(at + ": \"nproc\" is not a rank count");
    t.nproc = r["nproc"].get<int64_t>();
    if (!r.contains("sets_threads") || !r["sets_threads"].is_boolean())
      bad(at + ": \"sets_threads\" is not a boolean");
    t.sets_threads = r["sets_threads"].get<bool>();
    if (!r.contains("args") || !r["args"].is_array()) bad(at + ": \"args\" is not an array");
    for (const auto& a : r["args"]) {
      if (!a.is_string() || has_control_character(a.get<std::string>()))
        bad(at + ": an argument is not one line of text");
      t.args.push_back(a.get<std::string>());
    }
    file.runs.push_back(std::move(t));
  }
  if (file.runs.empty()) bad("no runs");
  return file;
}

TaskLaunch plan_task(const std::string& dir, int64_t index) {
  const RunsFile file = read_runs_file(dir);
  check_usage(
      index >= 0 && index < static_cast<int64_t>(file.runs.size()),
      fmt::format("task {}: {}/runs.json has runs 0 to {}", index, dir, file.runs.size() - 1),
      "pass an index of runs.json (Slurm's SLURM_ARRAY_TASK_ID)");
  const TaskRun& run = file.runs[static_cast<size_t>(index)];
  const fs::path root = fs::absolute(dir);
  TaskLaunch launch;
  launch.state = (root / "state" / fmt::format("task-{}", index)).string();
  // One file per attempt, never overwritten: the Slurm job's id (a new submission of the same
  // index is another job) and its requeue count.
  const int64_t restart = env_count("SLURM_RESTART_COUNT").value_or(0);
  const std::optional<int64_t> job = env_count("SLURM_JOB_ID");
  launch.result =
      (root / "results" /
       fmt::format("task-{}{}{}.json", index, job ? fmt::format(".j{}", *job) : std::string(),
                   restart > 0 ? fmt::format(".r{}", restart) : std::string()))
          .string();
  // With ranks each keeps its own part (state/task-I/rank-R). Every rank looks at every
  // part, so all decide alike: resume when each part is a state of this build and this run at
  // one step; else each rank clears its own part and the run starts afresh. Outside srun
  // (no SLURM_PROCID) `gradscope run --nproc N` starts every rank here: all parts are ours.
  const std::optional<int64_t> procid = run.nproc > 1 ? env_count("SLURM_PROCID") : std::nullopt;
  launch.own_state = procid ? rank_state_folder(launch.state, run.nproc, *procid) : launch.state;
  const std::optional<TrainStateInfo> info =
      resumable_state(launch.state, run.nproc, run.run_id, &launch.why);
  launch.resume = info.has_value();
  if (!launch.resume) remove_train_state(launch.own_state);

  launch.args = {"run"};
  if (!run.sets_threads) {
    // A resume keeps the threads its state was saved with (how the run is measured); else the
    // CPUs Slurm gave each task: --cpus-per-task, or one (Slurm's default) in a job without
    // it; outside Slurm, this machine's cores shared by the ranks.
    int64_t threads = 0;
    if (info) {
      const nlohmann::json saved = info->config.value("threads", nlohmann::json(nullptr));
      if (saved.is_number_integer() && saved.get<int64_t>() > 0) threads = saved.get<int64_t>();
    }
    if (threads == 0)
      threads = env_count("SLURM_CPUS_PER_TASK")
                    .value_or(job ? 1 : std::max<int64_t>(1, usable_cores() / run.nproc));
    launch.args.push_back("--threads");
    launch.args.push_back(std::to_string(std::max<int64_t>(1, threads)));
  }
  launch.args.insert(launch.args.end(), run.args.begin(), run.args.end());
  for (const std::string& extra :
       {std::string("--sweep"), file.sweep, std::string("--no-db"), std::string("--json"),
        launch.result, std::string("--save-state"), launch.state})
    launch.args.push_back(extra);
  if (launch.resume) {
    launch.args.push_back("--resume");
    launch.args.push_back(launch.state);
  }
  return launch;
}

bool is_task_result(const std::string& name, int64_t index) {
  // task-I.json, task-I.jJOB.json, task-I.rK.json, task-I.jJOB.rK.json
  const std::string stem = fmt::format("task-{}", index);
  if (name.size() < stem.size() + 5 || name.compare(0, stem.size(), stem) != 0 ||
      name.compare(name.size() - 5, 5, ".json") != 0)
    return false;
  std::string rest = name.substr(stem.size(), name.size() - stem.size() - 5);
  for (const char tag : {'j', 'r'}) {
    if (rest.size() < 3 || rest[0] != '.' || rest[1] != tag) continue;
    size_t n = 2;
    while (n < rest.size() && rest[n] >= '0' && rest[n] <= '9') ++n;
    if (n == 2) return false;
    rest = rest.substr(n);
  }
  return rest.empty();
}

}  // namespace gradscope
