// What competed with a run for its cores while its timed steps ran, and whether that makes its
// timings disturbed (docs/metrics.md, "Disturbance"). The figures are read by measure/
// (contention.h there) at each timed step's start and end; this part holds the record's
// summary and the rule, so that the record and the report read them the same way.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gradscope {

// One timed step's competition, as StepEntry keeps it (each nullopt where it could not be
// read: no /proc/stat, no getrusage).
struct StepContention {
  // Involuntary context switches of this process (all its threads) during the step: the
  // kernel took a core from one of its threads to give it to another task.
  std::optional<int64_t> involuntary_switches;
  // Steal time of the whole machine during the step (the hypervisor ran another guest on a
  // CPU this machine wanted), seconds summed over its CPUs.
  std::optional<double> steal_s;
  // Runnable tasks on the machine beyond the run's own threads: /proc/stat's procs_running
  // minus the run's threads (at least 0), the mean of the readings at the step's start and
  // end.
  std::optional<double> competing_tasks;
};

// The summary over the timed steps (record key "contention"); warm-up, evaluation and setup
// are outside its window.
struct RunContention {
  int64_t steps = 0;           // timed steps with readings
  int64_t threads = 0;         // the run's compute threads (env.threads)
  int64_t cpus = 0;            // CPUs of the machine, as /proc/stat counts them
  double timed_s = 0;          // wall seconds of those steps
  std::optional<int64_t> involuntary_switches;
  std::optional<double> involuntary_switches_per_s;  // per second of timed step time
  std::optional<double> steal_s;
  std::optional<double> steal_pct;  // steal_s / (timed_s x cpus) x 100
  std::optional<double> competing_tasks_mean;  // over the steps
  std::optional<double> competing_tasks_max;
  // Runnable tasks beyond what the machine's idle CPUs absorb: competing_tasks_mean minus
  // (cpus - threads), at least 0. Above the threshold, other tasks had to share the run's
  // cores.
  std::optional<double> excess_tasks_mean;
  bool disturbed = false;
  std::vector<std::string> reasons;  // one line per threshold crossed, with its figures
};

// The thresholds (docs/metrics.md gives their rationale). A run's timings are disturbed when
// any is crossed over its timed steps.
struct DisturbanceThresholds {
  // Other runnable tasks beyond the idle CPUs, on average: half a task means some task
  // waited for the run's cores at least half the time.
  double excess_tasks = 0.5;
  // Involuntary switches per second of step time per thread: a thread alone on its core is
  // preempted a few times a second (kernel threads, timers); one sharing its core with a busy
  // task is preempted at every time slice of the scheduler (hundreds a second).
  double switches_per_s_per_thread = 75;
  // Preemptions a second the run's own threads cause beyond its compute threads, added to the
  // switch threshold: its sampler wakes once a period and may take a core each time.
  double own_wakeups_per_s = 0;
  // Steal time, percent of the machine's CPU time over the steps.
  double steal_pct = 5;
};

// The summary of these steps' readings (the timed ones: `step_s` their wall times, in the
// same order) and the verdict by `thresholds`. A figure none of the steps has stays nullopt;
// no reading at all is not disturbed, and says so in reasons being empty.
RunContention summarize_contention(const std::vector<StepContention>& steps,
                                   const std::vector<double>& step_s, int64_t threads,
                                   int64_t cpus,
                                   const DisturbanceThresholds& thresholds = {});

}  // namespace gradscope
