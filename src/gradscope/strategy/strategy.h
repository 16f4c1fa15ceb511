// How the gradient of one optimizer step is computed, and how the parameters are updated from
// it, as the run's step plan (core/config.h) says: which blocks are recomputed in backward,
// how many micro-batches the effective batch is split into, and where the optimizer steps.
// Strategies never read a clock: they announce phase changes to an observer, and the training
// loop times them.
//
// Two parts, so that each setting combines with the others:
//   - Strategy computes the step's gradients: it installs recomputation on the model once and
//     runs the micro-batches (one, or --accum-steps of them) forward and backward;
//   - Updater (updater.h) turns them into an update: after backward (an optimizer over all
//     gradients, the default) or inside it (the fused step). It is the one seam through which
//     a way of computing a step owns the optimizer step; the training loop calls it the same
//     way whatever it is.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "gradscope/core/config.h"
#include "gradscope/comm/comm.h"
#include "gradscope/models/model.h"
#include "gradscope/strategy/checkpoint.h"

namespace gradscope {

// kComm: waiting on collectives between ranks (--shard), after backward and around the
// optimizer; what they did while backward ran is backward's time.
enum class Phase {
  kData = 0,
  kForward,
  kBackward,
  kOptimizer,
  kComm,
  kCount
};
const char* phase_name(Phase phase);

class PhaseObserver {
 public:
  virtual ~PhaseObserver() = default;
  // Called when `phase` starts; the previous phase ends there.
  virtual void enter(Phase phase) = 0;
};

// Which micro-batch a backward belongs to, told before that backward starts: an Updater that
// works inside the backward (accumulation folded into the optimizer state) needs to know it,
// and only the strategy does.
struct MicroBatchInfo {
  int64_t index = 0;         // 0 .. count - 1
  int64_t count = 1;         // micro-batches of the step (plan.accum_steps)
  int64_t targets = 0;       // this micro-batch's targets
  int64_t step_targets = 0;  // all micro-batches' targets (the loss's denominator, if > 0)
};

class MicroBatchListener {
 public:
  virtual ~MicroBatchListener() = default;
  // Called after micro-batch `info.index`'s forward and before its backward.
  virtual void before_backward(const MicroBatchInfo& info) = 0;
  // Called when that backward has returned.
  virtual void after_backward(const MicroBatchInfo& /*info*/) {}
};

// What the step's gradient was computed from.
struct StepOutput {
  torch::Tensor loss_sum;    // () detached: summed loss over all targets of the step
  int64_t target_count = 0;  // targets over all micro-batches
  int64_t samples = 0;
  int64_t tokens = 0;
};

// The micro-batches of one step. fetch(i) returns micro-batch i (0 .. micro_batches-1) where
// the data source keeps it (the host), its target count counted; to_device moves one to the
// device the model runs on. The strategy fetches all of them first (it needs the step's
// target count before the first backward) but moves each to the device only just before its
// forward and drops it after its backward, so one micro-batch's inputs are on the device at a
// time: accumulation exists to save device memory, and k images on the device would spend it.
// An empty to_device means that fetch's batches are already where the model runs.
struct MicroBatchSource {
  using Fetch = std::function<Batch(int64_t index)>;
  using ToDevice = std::function<Batch(const Batch& host)>;

  MicroBatchSource() = default;
  MicroBatchSource(Fetch fetch_batch, ToDevice to_device_batch)
      : fetch(std::move(fetch_batch)), to_device(std::move(to_device_batch)) {}
  // A source whose batches need no move (tests, and sources that make them on the device).
  template <typename F,
            typename = std::enable_if_t<std::is_invocable_r_v<Batch, F&, int64_t> &&
                                        !std::is_same_v<std::decay_t<F>, MicroBatchSource>>>
  MicroBatchSource(F fetch_batch)  // NOLINT(google-explicit-constructor): a plain function is one
      : fetch(std::move(fetch_batch)) {}

  Fetch fetch;
  ToDevice to_device;
};

class Strategy {
 public:
  // Checks the plan's settings (a usage error for a bad --checkpoint-every).
  explicit Strategy(const StepPlan& plan);

  // Installs the plan's memory methods on the model, the one seam through which they reach
  // its forward: recomputation at the block runner's recompute layer (RunnerLayer), if the
  // plan recomputes, and the loss head's options (--loss). Called once.
  void attach(Model& model);

  // Leaves the gradient of the mean per-target loss of the whole step (plan.accum_steps
  // micro-batches from `next`) in the parameters' .grad, accumulated onto what is there. Each
  // micro-batch's summed loss is divided by the target count of the whole step, never by the
  // number of micro-batches, so accumulation is exact with padded or masked targets. Phases:
  // data (every fetch, and the first micro-batch's move to the device), then forward and
  // backward of each micro-batch, with data again before each later one (its move).
  StepOutput compute_gradients(Model& model, const MicroBatchSource& next,
                               PhaseObserver& observer) const;

  // Tells `listener` (null: nobody) of every micro-batch before its backward; it must outlive
  // the calls to compute_gradients. The Updater that needs it (updater.h) provides it.
  void set_micro_batch_listener(MicroBatchListener* listener) { listener_ = listener; }

  // The ranks this step is shared with (--shard; null: one process). Each rank computes its
  // own micro-batches, but every loss is divided by the target count of all ranks, and the
  // step's output (loss, targets, samples, tokens) is summed over them: N ranks with
  // micro-batch b compute the step of one process with micro-batch N b.
  void set_communicator(std::shared_ptr<Communicator> comm) { comm_ = std::move(comm); }

  const StepPlan& plan() const { return plan_; }
  // The installed checkpoint runner (its counters), null when nothing is recomputed.
  const CheckpointRunner* checkpoint_runner() const { return runner_.get(); }

 private:
  StepPlan plan_;
  std::shared_ptr<CheckpointRunner> runner_;
  MicroBatchListener* listener_ = nullptr;
  std::shared_ptr<Communicator> comm_;
};

}  // namespace gradscope
