#include "gradscope/train/phase_timer.h"

namespace gradscope {

void PhaseTimer::begin_step() {
  seconds_.fill(0);
  current_ = -1;
  ++steps_;
  backward_in_step_ = false;
  forward_start_bytes_ = -1;
  boundaries_.clear();
}

void PhaseTimer::enter(Phase phase) {
  const std::optional<Phase> left =
      current_ < 0 ? std::nullopt : std::optional<Phase>(static_cast<Phase>(current_));
  close();
  current_ = static_cast<int>(phase);
  if (listener_) listener_(phase, left);
  if (!enabled_) return;
  meter_.reset_peak();
  start_bytes_ = meter_.current_bytes();
  // Each forward (one per micro-batch) is measured from its own start, so gradients that an
  // earlier micro-batch's backward left behind are not counted as activations.
  if (phase == Phase::kForward) forward_start_bytes_ = meter_.current_bytes();
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
  const int64_t peak = meter_.peak_bytes();
  const auto phase = static_cast<Phase>(current_);
  phase_peak_[current_] = std::max(phase_peak_[current_], peak);
  if (phase == Phase::kForward && forward_start_bytes_ >= 0)
    activations_peak_ = std::max(activations_peak_, peak - forward_start_bytes_);
  if (!peak_moment_ || peak > peak_moment_->peak_bytes) {
    // The new highest peak: what stood allocated then, as far as the phases tell.
    PeakMoment at;
    at.step = steps_;
    at.phase = phase;
    at.peak_bytes = peak;
    const bool in_pass = phase == Phase::kForward || phase == Phase::kBackward;
    at.forward_start_bytes = in_pass ? forward_start_bytes_ : -1;
    // An optimizer phase begins with every gradient of the step allocated.
    at.grads_exist = backward_in_step_ || phase == Phase::kOptimizer;
    at.state_exists = optimizer_done_;
    peak_moment_ = at;
  }
  if (phase == Phase::kBackward) backward_in_step_ = true;
  if (phase == Phase::kOptimizer) {
    optimizer_done_ = true;
    backward_in_step_ = false;  // the update frees the gradients
  }
  boundaries_.push_back({phase_name(static_cast<Phase>(current_)), start_bytes_,
                         meter_.peak_bytes(), meter_.current_bytes()});
  current_ = -1;
}

}  // namespace gradscope
