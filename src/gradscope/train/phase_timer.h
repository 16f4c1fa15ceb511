// Times the phases of a step and tracks the memory peak of each; the strategy and the updater
// announce phase changes (PhaseObserver), and only this reads the clock and the meter.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include <torch/torch.h>

#include "gradscope/core/record.h"
#include "gradscope/measure/clock.h"
#include "gradscope/measure/memory.h"
#include "gradscope/strategy/strategy.h"

namespace gradscope {

// The phase in which the allocator reached the highest peak of the phases so far, and what
// the timer knows of that moment beyond the total: whether the step's gradients and the
// optimizer's state existed then, and what was allocated when the micro-batch's forward began
// (everything above it then is that micro-batch's activations and backward's work).
struct PeakMoment {
  int64_t step = 0;  // begin_step() calls up to it: 1 is the run's first step (warm-up included)
  Phase phase = Phase::kData;
  int64_t peak_bytes = 0;
  // Bytes allocated when the current micro-batch's forward began; -1 outside forward and
  // backward.
  int64_t forward_start_bytes = -1;
  bool grads_exist = false;   // a backward or optimizer phase of the step began before
  bool state_exists = false;  // an optimizer phase had ended before (the state is allocated)
};

class PhaseTimer : public PhaseObserver {
 public:
  static constexpr int kPhases = static_cast<int>(Phase::kCount);

  // enabled false (--no-phase-timing): phases are tracked (for a failure's report) but neither
  // timed nor measured, so the step pays no synchronization or clock read per phase.
  PhaseTimer(const Clock& clock, MemoryMeter& meter, const torch::Device& device, bool enabled)
      : clock_(clock), meter_(meter), device_(device), enabled_(enabled) {}

  // Told as each phase begins, with the phase that ended there, if one did (the memory
  // labels follow the phases, train/memory_labels.h).
  using Listener = std::function<void(Phase entered, std::optional<Phase> left)>;
  void set_listener(Listener listener) { listener_ = std::move(listener); }

  void begin_step();
  void enter(Phase phase) override;
  // Ends the running phase (with a device synchronize before the clock read).
  void close();

  bool enabled() const { return enabled_; }
  // The phase running now (data before the first).
  Phase current() const { return current_ < 0 ? Phase::kData : static_cast<Phase>(current_); }
  // Seconds in each phase during the step begun last.
  double seconds(int phase) const { return seconds_[phase]; }
  // The step's memory at its phase boundaries, in the order entered.
  const std::vector<PhaseMemory>& boundaries() const { return boundaries_; }
  // Peaks over every step so far.
  int64_t phase_peak(int phase) const { return phase_peak_[phase]; }
  int64_t run_peak() const { return *std::max_element(phase_peak_.begin(), phase_peak_.end()); }
  int64_t activations_peak() const { return activations_peak_; }
  // The moment of run_peak(); nullopt before a phase has closed (or with enabled false).
  const std::optional<PeakMoment>& peak_moment() const { return peak_moment_; }

  // What the timer carries from step to step (peaks, their moment, the steps begun), kept in
  // a training state so that a resumed run's figures cover the steps before it too.
  struct Carried {
    std::array<int64_t, kPhases> phase_peak{};
    int64_t activations_peak = 0;
    std::optional<PeakMoment> peak_moment;
    int64_t steps = 0;
    bool optimizer_done = false;
  };
  Carried carried() const {
    return {phase_peak_, activations_peak_, peak_moment_, steps_, optimizer_done_};
  }
  void restore(const Carried& c) {
    phase_peak_ = c.phase_peak;
    activations_peak_ = c.activations_peak;
    peak_moment_ = c.peak_moment;
    steps_ = c.steps;
    optimizer_done_ = c.optimizer_done;
  }

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
  int64_t steps_ = 0;
  bool backward_in_step_ = false;  // a backward phase of this step has ended
  bool optimizer_done_ = false;    // an optimizer phase has ended
  std::optional<PeakMoment> peak_moment_;
  Listener listener_;
};

}  // namespace gradscope
