// Readings of what competes with this process for the CPUs: its involuntary context switches
// (getrusage), the machine's steal time and runnable tasks (/proc/stat). The trainer reads them
// at each timed step's start and end (core/contention.h holds the step's figures and the
// verdict); `gradscope sweep` reads the runnable tasks before it starts, to warn of a busy
// machine. Each read is a system call and one read of /proc/stat (a few microseconds).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "gradscope/core/contention.h"

namespace gradscope {

struct ContentionReading {
  std::optional<int64_t> involuntary_switches;  // this process, all threads, since it started
  std::optional<double> steal_s;                // the machine, all CPUs, since boot
  std::optional<int64_t> procs_running;         // runnable tasks now, this reader included
};

// /proc/stat's text -> steal seconds (the "cpu" line's eighth value, in ticks of
// `ticks_per_s`), runnable tasks ("procs_running") and CPUs (the "cpuN" lines); nullopt for
// what the text lacks.
struct ProcStat {
  std::optional<double> steal_s;
  std::optional<int64_t> procs_running;
  int64_t cpus = 0;
};
ProcStat parse_proc_stat(const std::string& text, double ticks_per_s);

// Reads everything now; what cannot be read stays nullopt.
ContentionReading read_contention();
// The machine's CPUs as /proc/stat counts them (those procs_running is counted over); at
// least 1.
int64_t machine_cpus();

// One step's figures from the readings at its start and end, for a run of `threads` threads.
StepContention step_contention(const ContentionReading& start, const ContentionReading& end,
                               int64_t threads);

// The machine's load before a sweep starts: the mean runnable tasks besides the reader over
// `readings` reads `interval_s` apart, against the CPUs. `busy` when other tasks take half a
// CPU or more on average: a sweep's runs use every CPU (their default threads, or the jobs
// that share them), so any such task competes with them.
struct MachineLoad {
  double other_tasks_mean = 0;
  int64_t cpus = 1;
  std::optional<double> loadavg_1min;  // /proc/loadavg, for the message
  bool measured = false;
  bool busy = false;
};
MachineLoad measure_machine_load(int readings = 10, double interval_s = 0.05);

}  // namespace gradscope
