// CPU time and CPU utilization of this process, the CPU counterpart of GPU utilization:
// utilization % = process CPU time / (wall time x threads) x 100, so 100% means every
// thread the run was given was busy all the time. BLAS threads beyond `threads` can push it
// above 100%; it is reported as measured, not clamped.
#pragma once

namespace gradscope {

// CPU seconds (user + system) this process has used, all threads together
// (CLOCK_PROCESS_CPUTIME_ID).
double process_cpu_seconds();

// The formula above; 0 when no wall time passed or threads < 1.
double cpu_utilization_pct(double cpu_s, double wall_s, int threads);

// Utilization between two marks: made (or restart()ed) at the first, read at the second.
class CpuUtilization {
 public:
  // threads: the threads the run is allowed (--threads), the denominator of the formula.
  explicit CpuUtilization(int threads);
  void restart();
  // Utilization since construction or the last restart().
  double pct() const;
  // The two deltas pct() is made of.
  double cpu_s() const;
  double wall_s() const;

 private:
  int threads_;
  double start_cpu_s_ = 0.0;
  double start_wall_s_ = 0.0;
};

}  // namespace gradscope
