// Talking to the cluster: commands run with a deadline, its nodes' CPUs asked of sinfo, and
// a job folder's arrays submitted with sbatch and watched in squeue.
#include "gradscope/sweep/slurm.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/core/log.h"

namespace gradscope {
namespace fs = std::filesystem;
namespace {

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

namespace {

// The first line of what a command said, on stderr if anything, else on stdout.
std::string said(const CommandOutput& r) {
  return terminal_text(output_line(r.errors.empty() ? r.output : r.errors));
}

// What to do when Slurm refuses a job or a task can never start.
const char* const kResourcesHint =
    "change the resources ([slurm] in the sweep file, or --partition, --time, --mem, "
    "--cpus-per-task, --gpus-per-task) to what the cluster has";

void cancel_jobs(const std::vector<std::string>& ids) {
  if (ids.empty()) return;
  std::vector<std::string> argv = {"scancel"};
  argv.insert(argv.end(), ids.begin(), ids.end());
  run_command(argv, 30);
}

// Appends a job id to jobs.txt as soon as sbatch gives it (O_APPEND: lines of two submissions
// at once do not mix), so no queued job goes unrecorded.
void record_job(const std::string& jobs_path, const std::string& id) {
  const int fd = open(jobs_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  const std::string line = id + "\n";
  const bool ok =
      fd >= 0 && write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  if (fd >= 0) close(fd);
  if (!ok)
    log_warn("job {} is queued but could not be added to {}: {}", id, jobs_path,
             std::strerror(errno));
}

// The job id `sbatch --parsable` printed: "ID" or "ID;CLUSTER" on stdout, the last line
// (warnings go to stderr); empty if none.
std::string parsable_job_id(const std::string& output) {
  std::string id;
  for (std::string line : text_lines(output)) {
    line = line.substr(0, line.find(';'));
    if (!line.empty() && line.size() <= 20 &&
        std::all_of(line.begin(), line.end(), [](char c) { return c >= '0' && c <= '9'; }))
      id = line;
  }
  return id;
}

// Submits each array for real; a failed submission cancels the jobs submitted before it.
std::vector<std::string> submit_arrays(const SlurmEmit& emitted, const std::string& dir,
                                       std::FILE* out) {
  const std::string jobs_path = (fs::path(dir) / "jobs.txt").string();
  std::vector<std::string> ids;
  for (const SlurmArray& array : emitted.arrays) {
    const CommandOutput r = run_command({"sbatch", "--parsable", array.script}, 60);
    const std::string id = parsable_job_id(r.output);
    if (r.code != 0 || id.empty()) {
      cancel_jobs(ids);
      fail_usage(
          fmt::format("sbatch {} {}: {}{}", array.script,
                      r.code == -1 ? "did not answer in 60 s" : "failed", said(r),
                      ids.empty() ? "" : fmt::format(" (cancelled the jobs submitted before it)")),
          r.code == 0 || r.code == -1
              ? "the job may be queued all the same: see squeue --name gradscope-<sweep name>"
              : kResourcesHint);
    }
    ids.push_back(id);
    record_job(jobs_path, id);
    fmt::print(out, "submitted job {}: {} ({} task{})\n", id, array.script, array.tasks.size(),
               array.tasks.size() == 1 ? "" : "s");
  }
  return ids;
}

// One look at the jobs' tasks in squeue: how many are in each state ("running", "pending
// (Resources)"). A task pending for a reason that waiting cannot cure cancels its array and
// is a usage error.
std::map<std::string, int64_t> task_states(const std::vector<std::string>& ids,
                                           const std::string& list) {
  // Reasons a pending task keeps whatever it waits: the cluster has no place for it.
  static const char* const never[] = {
      "PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints",
      "InvalidAccount",  "InvalidQOS",         "AccountNotAllowed"};
  // %F: the array's job id (the one sbatch gave), %i: the task's.
  const CommandOutput q = run_command(
      {"squeue", "--noheader", "--array", "--jobs=" + list, "--format=%F|%i|%T|%r"}, 30);
  std::map<std::string, int64_t> counts;
  for (const std::string& line : q.code == 0 ? text_lines(q.output) : std::vector<std::string>{}) {
    const size_t a = line.find('|'), b = line.find('|', a + 1), c = line.rfind('|');
    if (a == std::string::npos || b == std::string::npos || c <= b) continue;
    const std::string job = line.substr(0, a), task = line.substr(a + 1, b - a - 1),
                      state = line.substr(b + 1, c - b - 1), reason = line.substr(c + 1);
    if (state == "PENDING")
      for (const char* n : never)
        if (reason == n) {
          // That array alone: the others' tasks may be running and are left alone.
          const bool ours = std::find(ids.begin(), ids.end(), job) != ids.end();
          if (ours) cancel_jobs({job});
          fail_usage(fmt::format("task {} cannot start: Slurm says {}{}", terminal_text(task),
                                 terminal_text(reason),
                                 ours ? fmt::format(" (cancelled job {})", job) : ""),
                     kResourcesHint);
        }
    ++counts[state == "PENDING" ? "pending (" + reason + ")" : lower_text(state)];
  }
  return counts;
}

}  // namespace

std::vector<std::string> submit_slurm(const SlurmEmit& emitted, const std::string& dir,
                                      double watch_s, std::FILE* out) {
  for (const SlurmArray& array : emitted.arrays) {
    const CommandOutput test = run_command({"sbatch", "--test-only", array.script}, 60);
    check_usage(test.code != -1, "sbatch did not run (or did not answer in 60 s)",
                "submit on a machine of the cluster (where sbatch is), or drop --submit");
    check_usage(test.code == 0, fmt::format("Slurm refuses {}: {}", array.script, said(test)),
                kResourcesHint);
  }
  const std::vector<std::string> ids = submit_arrays(emitted, dir, out);
  std::string list;
  for (const std::string& id : ids) list += (list.empty() ? "" : ",") + id;
  // Watched while a task waits, up to watch_s.
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(watch_s * 1000));
  std::map<std::string, int64_t> counts;
  for (;;) {
    counts = task_states(ids, list);
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

}  // namespace gradscope
