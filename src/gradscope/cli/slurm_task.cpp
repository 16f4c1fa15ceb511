// `gradscope task DIR I`: what a Slurm array task of `gradscope sweep --emit slurm` runs. It
// reads run I of DIR/runs.json and starts `gradscope run` with its arguments (an argument
// vector: no shell ever reads a run's values), resuming DIR/state/task-I when a stopped or
// requeued attempt left a state there.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>

#include "gradscope/cli/commands.h"
#include "gradscope/core/error.h"
#include "gradscope/core/log.h"
#include "gradscope/sweep/slurm.h"
#include "gradscope/train/train_state.h"

namespace gradscope {
namespace {

volatile sig_atomic_t child_pid = 0;

// Slurm signals every process of a task it stops; a stop sent to this one alone (kill, a
// scheduler that signals the batch shell's main process) reaches the run too. A second
// SIGTERM is harmless to a run that is saving its state.
void forward_stop(int) {
  const pid_t pid = child_pid;
  if (pid > 0) kill(pid, SIGTERM);
}

int run_task(const std::string& dir, int64_t index) {
  const TaskLaunch launch = plan_task(dir, index);
  if (!launch.why.empty())
    log_warn("task {}: the training state in {} cannot be resumed ({}); starting afresh", index,
             launch.state, launch.why);
  log_info("task {}: {}{}", index, launch.resume ? "resuming from " : "starting; state in ",
           launch.state);
  std::vector<std::string> argv = {"gradscope"};
  argv.insert(argv.end(), launch.args.begin(), launch.args.end());
  std::vector<char*> cargv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);

  struct sigaction forward {};
  forward.sa_handler = forward_stop;
  sigemptyset(&forward.sa_mask);
  forward.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &forward, nullptr);
  sigaction(SIGINT, &forward, nullptr);
  const pid_t pid = fork();
  if (pid < 0) fail_runtime(std::string("cannot start the run: ") + std::strerror(errno));
  if (pid == 0) {
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    execv("/proc/self/exe", cargv.data());
    std::fprintf(stderr, "error: cannot start gradscope run: %s\n", std::strerror(errno));
    _exit(127);
  }
  child_pid = pid;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  child_pid = 0;
  if (WIFSIGNALED(status)) {
    log_warn("task {}: the run was killed by signal {}", index, WTERMSIG(status));
    return 128 + WTERMSIG(status);
  }
  const int code = WEXITSTATUS(status);
  // 0 and 1: the run recorded a final status (1: a failure status such as oom or diverged,
  // which its record holds), so the task did its work and its state is of no more use. Any
  // other end keeps the state for the next attempt.
  if (code == 0 || code == 1) {
    remove_train_state(launch.own_state);
    std::error_code ec;
    std::filesystem::remove(launch.state, ec);  // only once every rank's part is gone
  }
  return code == 1 ? 0 : code;
}

}  // namespace

void add_task_command(CLI::App& root, int& exit_code) {
  auto dir = std::make_shared<std::string>();
  auto index = std::make_shared<int64_t>(-1);
  CLI::App* cmd = root.add_subcommand(
      "task",
      "Run task I of a job folder written by `gradscope sweep --emit slurm` (what each Slurm\n"
      "array task does): run I of DIR/runs.json, its record in DIR/results/task-I.json\n"
      "(task-I.rK.json after K requeues), its training state kept in DIR/state/task-I and\n"
      "resumed when a stopped or requeued attempt left one. Exit 0 when the run recorded a\n"
      "status of its own (ok, oom, diverged, ...), 75 when it was stopped (its state saved).\n"
      "Example: gradscope task cluster/paper 3");
  cmd->add_option("dir", *dir, "The job folder (--out of --emit slurm)")->required();
  cmd->add_option("index", *index, "The run's index in runs.json (SLURM_ARRAY_TASK_ID)")
      ->required();
  cmd->callback([dir, index, &exit_code] { exit_code = run_task(*dir, *index); });
}

}  // namespace gradscope
