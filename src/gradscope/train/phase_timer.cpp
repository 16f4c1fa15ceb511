#include "gradscope/train/phase_timer.h"

namespace gradscope {

void PhaseTimer::begin_step() {
  seconds_.fill(0);
  current_ = -1;
  forward_start_bytes_ = -1;
  boundaries_.clear();
}

void PhaseTimer::enter(Phase phase) {
  close();
  current_ = static_cast<int>(phase);
  if (!enabled_) return;
  meter_.reset_peak();
  start_bytes_ = meter_.current_bytes();
  // Each forward (one per micro-batch) is measured from its own start, so gradients that an
  // earlier micro-batch's backward left behind are not counted as activations.
  if (phase == Phase::kPhaseForward) forward_start_bytes_ = meter_.current_bytes();
  started_ = clock_.now_s();
}

void PhaseTimer::close() {
  if (current_ < 0) return;
  if (!enabled_) {
    current_ = -1;
    return;
  }
  sync(device_);
  seconds_[current_] += clock_.now_s() - started_;
  phase_peak_[current_] = std::max(phase_peak_[current_], meter_.peak_bytes());
  if (current_ == static_cast<int>(Phase::kPhaseForward) && forward_start_bytes_ >= 0)
    activations_peak_ = std::max(activations_peak_, meter_.peak_bytes() - forward_start_bytes_);
  boundaries_.push_back({phase_name(static_cast<Phase>(current_)), start_bytes_,
                         meter_.peak_bytes(), meter_.current_bytes()});
  current_ = -1;
}

}  // namespace gradscope
