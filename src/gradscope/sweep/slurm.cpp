#include "gradscope/sweep/slurm.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

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

// A command's output as lines, trailing white space (and carriage returns) removed.
std::vector<std::string> text_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    lines.push_back(std::move(line));
    start = end + 1;
  }
  return lines;
}

// The first line of a command's output that says something.
std::string output_line(const std::string& text) {
  for (const std::string& line : text_lines(text))
    if (!line.empty()) return line.substr(0, 500);
  return "(no output)";
}

std::string lower_text(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
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

}  // namespace

CommandOutput run_command(const std::vector<std::string>& argv, double timeout_s) {
  CommandOutput result;
  if (argv.empty()) return result;
  int out_fds[2], err_fds[2];
  if (pipe2(out_fds, O_CLOEXEC) != 0) return result;
  if (pipe2(err_fds, O_CLOEXEC) != 0) {
    close(out_fds[0]);
    close(out_fds[1]);
    return result;
  }
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    for (int fd : {out_fds[0], out_fds[1], err_fds[0], err_fds[1]}) close(fd);
    return result;
  }
  if (pid == 0) {
    dup2(out_fds[1], STDOUT_FILENO);
    dup2(err_fds[1], STDERR_FILENO);
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    execvp(cargv[0], cargv.data());
    _exit(127);
  }
  close(out_fds[1]);
  close(err_fds[1]);
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(std::max(0.0, timeout_s) * 1000));
  bool timed_out = false;
  char buf[4096];
  pollfd fds[2] = {{out_fds[0], POLLIN, 0}, {err_fds[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.output, &result.errors};
  int open_fds = 2;
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    const int ready = poll(fds, 2, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;  // poll skips it
        --open_fds;
        continue;
      }
      if (sinks[i]->size() < (1u << 20)) sinks[i]->append(buf, static_cast<size_t>(n));
    }
  }
  for (const pollfd& p : fds)
    if (p.fd >= 0) close(p.fd);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!timed_out && WIFEXITED(status)) result.code = WEXITSTATUS(status);
  if (result.code == 127 && result.output.empty() && result.errors.empty())
    result.code = -1;  // not found
  return result;
}

std::optional<int64_t> slurm_node_cpus(const std::string& partition) {
  std::vector<std::string> argv = {"sinfo", "--noheader", "--Node", "--format=%c"};
  if (!partition.empty()) argv.push_back("--partition=" + partition);
  const CommandOutput r = run_command(argv, 15);
  if (r.code != 0) return std::nullopt;
  std::optional<int64_t> most;
  for (const std::string& line : text_lines(r.output)) {
    char* stop = nullptr;
    const long long n = std::strtoll(line.c_str(), &stop, 10);
    if (stop != line.c_str() && n > 0) most = std::max<int64_t>(most.value_or(0), n);
  }
  return most;
}

SlurmEmit emit_slurm(const Sweep& sweep, const std::vector<PlannedRun>& plan,
                     const std::string& dir, const std::string& executable,
                     const SlurmSettings& slurm, std::optional<int64_t> node_cpus) {
  check_usage(!plan.empty(), "the sweep has no runs to emit");
  check_usage(is_plain_name(sweep.name, 64),
              fmt::format("the sweep name '{}' is not a plain name", terminal_text(sweep.name)),
              "write name = \"...\" with letters, digits, '.', '_' or '-'");
  check_usage(!executable.empty() && !has_control_character(executable),
              "the gradscope executable's path holds a control character",
              "install gradscope under a plain path");
  const std::string root = checked_job_folder(dir);
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"partition", slurm.partition},
                                                        {"account", slurm.account},
                                                        {"time", slurm.time},
                                                        {"mem", slurm.mem},
                                                        {"gpus_per_task", slurm.gpus_per_task}})
    if (!value.empty()) check_slurm_setting(key, value);
  check_usage(slurm.cpus_per_task >= 0,
              fmt::format("--cpus-per-task {} must be at least 1", slurm.cpus_per_task));

  SlurmEmit emitted;
  check_usage(!node_cpus || slurm.cpus_per_task <= *node_cpus,
              fmt::format("--cpus-per-task {}: no node of {} has that many CPUs (the largest "
                          "has {}); the job could never start",
                          slurm.cpus_per_task,
                          slurm.partition.empty() ? "the default partition"
                                                  : "partition " + slurm.partition,
                          node_cpus.value_or(0)),
              fmt::format("ask for at most {} (or leave it out: gradscope fits it)",
                          node_cpus.value_or(0)));
  // CPUs per rank: as asked; else up to 4 with a run's ranks on one node; else the cluster's.
  auto cpus_for = [&](int64_t nproc) -> int64_t {
    if (slurm.cpus_per_task > 0) return slurm.cpus_per_task;
    if (node_cpus) return std::max<int64_t>(1, std::min<int64_t>(4, *node_cpus / nproc));
    return 0;
  };
  emitted.note =
      slurm.cpus_per_task > 0 ? fmt::format("{} CPUs per task, as asked", slurm.cpus_per_task)
      : node_cpus             ? fmt::format(
                                    "CPUs per task: up to 4, a run's ranks within the largest node's {} "
                                                "(sinfo)",
                                    *node_cpus)
                  : fmt::format(
                        "CPUs per task left to the cluster (one by default): sinfo named no "
                        "node{} here; pass --cpus-per-task N",
                        slurm.partition.empty() ? "" : " of partition " + slurm.partition);

  // A run's ranks share one node (--nodes=1), a CPU each at least.
  for (size_t i = 0; node_cpus && i < plan.size(); ++i) {
    const int64_t nproc = std::max<int64_t>(1, plan[i].resolved.config.nproc);
    check_usage(nproc <= *node_cpus,
                fmt::format("run {} ({}) has {} ranks, but the largest node of {} has {} CPUs; "
                            "its ranks share one node, so the job could never start",
                            i, terminal_text(plan[i].label), nproc,
                            slurm.partition.empty() ? "the default partition"
                                                    : "partition " + slurm.partition,
                            *node_cpus),
                "use fewer ranks (nproc), or a partition of larger nodes");
  }

  // Group the runs by their ranks: an array's tasks all ask for the same resources.
  std::map<int64_t, std::vector<size_t>> by_nproc;
  bool cuda = false;
  nlohmann::json runs = nlohmann::json::array();
  for (size_t i = 0; i < plan.size(); ++i) {
    const PlannedRun& p = plan[i];
    const RunConfig& c = p.resolved.config;
    by_nproc[std::max<int64_t>(1, c.nproc)].push_back(i);
    cuda = cuda || c.device.rfind("cuda", 0) == 0;
    // Under Slurm a run past run_timeout must record timeout itself, as a local sweep's
    // does, before Slurm's own limit (run_timeout + 5 minutes) stops it.
    std::vector<std::string> args = p.spec.args();
    if (sweep.settings.run_timeout_s > 0 && !p.spec.values.count("timeout")) {
      args.push_back("--timeout");
      args.push_back(fmt::format("{}", sweep.settings.run_timeout_s));
    }
    runs.push_back({{"index", i},
                    {"run_id", p.run_id},
                    {"label", p.label},
                    {"nproc", std::max<int64_t>(1, c.nproc)},
                    {"sets_threads", p.spec.values.count("threads") > 0},
                    {"args", args}});
  }

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

  for (const auto& [nproc, tasks] : by_nproc) {
    SlurmArray array;
    array.nproc = nproc;
    array.tasks = tasks;
    array.cpus_per_task = cpus_for(nproc);
    array.script =
        root + "/" +
        (nproc == 1 ? std::string("sweep.sbatch") : fmt::format("sweep-n{}.sbatch", nproc));
    emitted.arrays.push_back(std::move(array));
  }
  auto directives_of = [&](const SlurmArray& array) {
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
  };

  std::error_code ec;
  // Tasks of an earlier emit still queued would read the new runs.json and run other runs
  // into the same result files: a folder holds one grid.
  if (fs::exists(root + "/runs.json", ec)) {
    bool same = false;
    try {
      const RunsFile before = read_runs_file(root);
      same = before.runs.size() == plan.size();
      for (size_t i = 0; same && i < plan.size(); ++i)
        same = before.runs[i].run_id == plan[i].run_id;
    } catch (const Error&) {
    }
    check_usage(
        same,
        fmt::format("{} holds the job of another grid (its runs.json lists other runs)", root),
        "choose a new --out folder; remove that one only once its jobs have ended and "
        "its results are collected");
  }
  for (const char* sub : {"results", "logs", "state"})
    fs::create_directories(fs::path(root) / sub, ec);
  check_usage(!ec && fs::is_directory(fs::path(root) / "state"),
              fmt::format("cannot create the job folder {}: {}", root, ec.message()),
              "choose a writable --out folder");
  const nlohmann::json file = {{"format", kRunsFormat},
                               {"version", kRunsVersion},
                               {"sweep", sweep.name},
                               {"source", sweep.path},
                               {"runs", runs}};
  write_file_atomically(root + "/runs.json", file.dump(1) + "\n");
  for (const SlurmArray& array : emitted.arrays) {
    const std::string directives = directives_of(array);
    write_file_atomically(array.script, script_text(sweep, root, executable, array, directives));
    fs::permissions(array.script, fs::perms::owner_exec | fs::perms::group_exec,
                    fs::perm_options::add, ec);
  }
  // A script of an earlier emit for ranks this grid no longer has would run stale indices.
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name == "sweep.sbatch" ||
                      (name.rfind("sweep-n", 0) == 0 && entry.path().extension() == ".sbatch");
    if (ours &&
        std::none_of(emitted.arrays.begin(), emitted.arrays.end(),
                     [&](const SlurmArray& a) { return a.script == entry.path().string(); }))
      fs::remove(entry.path(), ec);
  }
  return emitted;
}

std::vector<std::string> submit_slurm(const SlurmEmit& emitted, const std::string& dir,
                                      double watch_s, std::FILE* out) {
  const std::string hint =
      "change the resources ([slurm] in the sweep file, or --partition, --time, --mem, "
      "--cpus-per-task, --gpus-per-task) to what the cluster has";
  auto said = [](const CommandOutput& r) {
    return terminal_text(output_line(r.errors.empty() ? r.output : r.errors));
  };
  for (const SlurmArray& array : emitted.arrays) {
    const CommandOutput test = run_command({"sbatch", "--test-only", array.script}, 60);
    check_usage(test.code != -1, "sbatch did not run (or did not answer in 60 s)",
                "submit on a machine of the cluster (where sbatch is), or drop --submit");
    check_usage(test.code == 0, fmt::format("Slurm refuses {}: {}", array.script, said(test)),
                hint);
  }
  // Each id is appended to jobs.txt as soon as sbatch gives it (O_APPEND: lines of two
  // submissions at once do not mix), so no queued job goes unrecorded.
  const std::string jobs_path = (fs::path(dir) / "jobs.txt").string();
  auto record_job = [&](const std::string& id) {
    const int fd = open(jobs_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    const std::string line = id + "\n";
    const bool ok =
        fd >= 0 && write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
    if (fd >= 0) close(fd);
    if (!ok)
      log_warn("job {} is queued but could not be added to {}: {}", id, jobs_path,
               std::strerror(errno));
  };
  std::vector<std::string> ids;
  auto cancel = [&](const std::vector<std::string>& which) {
    if (which.empty()) return;
    std::vector<std::string> argv = {"scancel"};
    argv.insert(argv.end(), which.begin(), which.end());
    run_command(argv, 30);
  };
  for (const SlurmArray& array : emitted.arrays) {
    const CommandOutput r = run_command({"sbatch", "--parsable", array.script}, 60);
    // --parsable prints "ID" or "ID;CLUSTER" on stdout, the last line; warnings go to stderr.
    std::string id;
    for (std::string line : text_lines(r.output)) {
      line = line.substr(0, line.find(';'));
      if (!line.empty() && line.size() <= 20 &&
          std::all_of(line.begin(), line.end(), [](char c) { return c >= '0' && c <= '9'; }))
        id = line;
    }
    if (r.code != 0 || id.empty()) {
      cancel(ids);
      fail_usage(
          fmt::format("sbatch {} {}: {}{}", array.script,
                      r.code == -1 ? "did not answer in 60 s" : "failed", said(r),
                      ids.empty() ? "" : fmt::format(" (cancelled the jobs submitted before it)")),
          r.code == 0 || r.code == -1
              ? "the job may be queued all the same: see squeue --name gradscope-<sweep name>"
              : hint);
    }
    ids.push_back(id);
    record_job(id);
    fmt::print(out, "submitted job {}: {} ({} task{})\n", id, array.script, array.tasks.size(),
               array.tasks.size() == 1 ? "" : "s");
  }
  std::string list;
  for (const std::string& id : ids) list += (list.empty() ? "" : ",") + id;
  // Reasons a pending task keeps whatever it waits: the cluster has no place for it.
  static const char* const never[] = {
      "PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints",
      "InvalidAccount",  "InvalidQOS",         "AccountNotAllowed"};
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(watch_s * 1000));
  std::map<std::string, int64_t> counts;
  for (;;) {
    // %F: the array's job id (the one sbatch gave), %i: the task's.
    const CommandOutput q = run_command(
        {"squeue", "--noheader", "--array", "--jobs=" + list, "--format=%F|%i|%T|%r"}, 30);
    counts.clear();
    for (const std::string& line :
         q.code == 0 ? text_lines(q.output) : std::vector<std::string>{}) {
      const size_t a = line.find('|'), b = line.find('|', a + 1), c = line.rfind('|');
      if (a == std::string::npos || b == std::string::npos || c <= b) continue;
      const std::string job = line.substr(0, a), task = line.substr(a + 1, b - a - 1),
                        state = line.substr(b + 1, c - b - 1), reason = line.substr(c + 1);
      if (state == "PENDING")
        for (const char* n : never)
          if (reason == n) {
            // That array alone: the others' tasks may be running and are left alone.
            const bool ours = std::find(ids.begin(), ids.end(), job) != ids.end();
            if (ours) cancel({job});
            fail_usage(fmt::format("task {} cannot start: Slurm says {}{}", terminal_text(task),
                                   terminal_text(reason),
                                   ours ? fmt::format(" (cancelled job {})", job) : ""),
                       hint);
          }
      ++counts[state == "PENDING" ? "pending (" + reason + ")" : lower_text(state)];
    }
    const bool waiting = std::any_of(counts.begin(), counts.end(), [](const auto& kv) {
      return kv.first.rfind("pending", 0) == 0;
    });
    if (!waiting || std::chrono::steady_clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  std::string where;
  for (const auto& [state, n] : counts)
    where += fmt::format("{}{} {}", where.empty() ? "" : ", ", n, terminal_text(state));
  fmt::print(out, "tasks: {}\n", where.empty() ? "none queued (done, or gone)" : where);
  return ids;
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
