#include "gradscope/core/contention.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace gradscope {

RunContention summarize_contention(const std::vector<StepContention>& steps,
                                   const std::vector<double>& step_s, int64_t threads,
                                   int64_t cpus, const DisturbanceThresholds& thresholds) {
  RunContention out;
  out.threads = std::max<int64_t>(threads, 1);
  out.cpus = std::max<int64_t>(cpus, 1);
  int64_t switches = 0, with_switches = 0, with_steal = 0, with_tasks = 0;
  double steal = 0, tasks_sum = 0, tasks_max = 0, switch_s = 0, steal_time_s = 0;
  for (size_t i = 0; i < steps.size() && i < step_s.size(); ++i) {
    const StepContention& s = steps[i];
    const double t = std::max(step_s[i], 0.0);
    if (!s.involuntary_switches && !s.steal_s && !s.competing_tasks) continue;
    ++out.steps;
    out.timed_s += t;
    if (s.involuntary_switches) {
      switches += *s.involuntary_switches;
      switch_s += t;
      ++with_switches;
    }
    if (s.steal_s) {
      steal += *s.steal_s;
      steal_time_s += t;
      ++with_steal;
    }
    if (s.competing_tasks) {
      tasks_sum += *s.competing_tasks;
      tasks_max = std::max(tasks_max, *s.competing_tasks);
      ++with_tasks;
    }
  }
  if (with_switches > 0) {
    out.involuntary_switches = switches;
    if (switch_s > 0) out.involuntary_switches_per_s = static_cast<double>(switches) / switch_s;
  }
  if (with_steal > 0) {
    out.steal_s = steal;
    if (steal_time_s > 0)
      out.steal_pct = 100.0 * steal / (steal_time_s * static_cast<double>(out.cpus));
  }
  if (with_tasks > 0) {
    out.competing_tasks_mean = tasks_sum / static_cast<double>(with_tasks);
    out.competing_tasks_max = tasks_max;
    const double idle = static_cast<double>(std::max<int64_t>(out.cpus - out.threads, 0));
    out.excess_tasks_mean = std::max(0.0, *out.competing_tasks_mean - idle);
  }

  if (out.excess_tasks_mean && *out.excess_tasks_mean > thresholds.excess_tasks)
    out.reasons.push_back(fmt::format(
        "{:.2f} runnable tasks besides the run's {} threads on {} CPUs, {:.2f} more than the idle "
        "CPUs absorb (threshold {})",
        *out.competing_tasks_mean, out.threads, out.cpus, *out.excess_tasks_mean,
        thresholds.excess_tasks));
  const double switch_limit =
      thresholds.switches_per_s_per_thread * static_cast<double>(out.threads) +
      thresholds.own_wakeups_per_s;
  if (out.involuntary_switches_per_s && *out.involuntary_switches_per_s > switch_limit)
    out.reasons.push_back(fmt::format(
        "{:.0f} involuntary context switches per second of step time (threshold {:.0f}: {} per "
        "thread{})",
        *out.involuntary_switches_per_s, switch_limit, thresholds.switches_per_s_per_thread,
        thresholds.own_wakeups_per_s > 0
            ? fmt::format(", and {:.0f} of the run's sampler", thresholds.own_wakeups_per_s)
            : ""));
  if (out.steal_pct && *out.steal_pct > thresholds.steal_pct)
    out.reasons.push_back(
        fmt::format("steal time {:.1f}% of the machine's CPU time (threshold {}%)",
                    *out.steal_pct, thresholds.steal_pct));
  out.disturbed = !out.reasons.empty();
  return out;
}

}  // namespace gradscope
