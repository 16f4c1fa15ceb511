// Times the phases of a step and tracks the memory peak of each; the strategy and the updater
// announce phase changes (PhaseObserver), and only this reads the clock and the meter.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "gradscope/core/record.h"
#include "gradscope/measure/clock.h"
#include "gradscope/measure/memory.h"
#include "gradscope/strategy/strategy.h"

namespace gradscope {

class PhaseTimer : public PhaseObserver {
 public:
  static constexpr int kPhases = static_cast<int>(Phase::kPhaseCount);

  // enabled false (--no-phase-timing): phases are tracked (for a failure's report) but neither
  // timed nor measured, so the step pays no synchronization or clock read per phase.
  PhaseTimer(const Clock& clock, MemoryMeter& meter, const torch::Device& device, bool enabled)
      : clock_(clock), meter_(meter), device_(device), enabled_(enabled) {}

  void begin_step();
  void enter(Phase phase) override;
  // Ends the running phase (with a device synchronize before the clock read).
  void close();

  bool enabled() const { return enabled_; }
  // The phase running now (data before the first).
  Phase current() const { return current_ < 0 ? Phase::kPhaseData : static_cast<Phase>(current_); }
  // Seconds in each phase during the step begun last.
  double seconds(int phase) const { return seconds_[phase]; }
  // The step's memory at its phase boundaries, in the order entered.
  const std::vector<PhaseMemory>& boundaries() const { return boundaries_; }
  // Peaks over every step so far.
  int64_t phase_peak(int phase) const { return phase_peak_[phase]; }
  int64_t run_peak() const { return *std::max_element(phase_peak_.begin(), phase_peak_.end()); }
  int64_t activations_peak() const { return activations_peak_; }

 private:
  const Clock& clock_;
  MemoryMeter& meter_;
  torch::Device device_;
  bool enabled_ = true;
  std::array<double, kPhases> seconds_{};
  std::array<int64_t, kPhases> phase_peak_{};
  int current_ = -1;
  double started_ = 0;
  int64_t start_bytes_ = 0;
  int64_t forward_start_bytes_ = -1;
  int64_t activations_peak_ = 0;
  std::vector<PhaseMemory> boundaries_;
};

}  // namespace gradscope
