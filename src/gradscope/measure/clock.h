// Wall-clock time for the training loop. Only train/ reads a clock; it reads one through
// this interface so tests can drive time by hand.
#pragma once

#include <torch/torch.h>

namespace gradscope {

class Clock {
 public:
  virtual ~Clock() = default;
  // Seconds since an arbitrary, fixed origin; only differences mean anything.
  virtual double now_s() const = 0;
};

// std::chrono::steady_clock: never steps back when the system time is adjusted.
class SteadyClock final : public Clock {
 public:
  double now_s() const override;
};

// Time stands still until a test moves it.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(double start_s = 0.0) : now_s_(start_s) {}
  double now_s() const override { return now_s_; }
  void advance(double seconds) { now_s_ += seconds; }
  void set(double now_s) { now_s_ = now_s; }

 private:
  double now_s_;
};

// Waits until the device has finished the work queued so far, so that a clock read after
// it covers that work: CUDA kernels run asynchronously and a bare read would time only
// their launch. A no-op on CPU, where every op has finished when it returns.
void sync(const torch::Device& device);

}  // namespace gradscope
