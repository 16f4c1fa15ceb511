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
#include <vector>

#include <torch/torch.h>

#include "gradscope/core/config.h"
#include "gradscope/models/model.h"
#include "gradscope/strategy/checkpoint.h"

namespace gradscope {

enum class Phase { kPhaseData = 0, kPhaseForward, kPhaseBackward, kPhaseOptimizer, kPhaseCount };
const char* phase_name(Phase phase);

class PhaseObserver {
 public:
  virtual ~PhaseObserver() = default;
  // Called when `phase` starts; the previous phase ends there.
  virtual void enter(Phase phase) = 0;
};

// What the step's gradient was computed from.
struct StepOutput {
  torch::Tensor loss_sum;    // () detached: summed loss over all targets of the step
  int64_t target_count = 0;  // targets over all micro-batches
  int64_t samples = 0;
  int64_t tokens = 0;
};

// Returns micro-batch `index` (0 .. micro_batches-1) of the current step, on the device.
using MicroBatchSource = std::function<Batch(int64_t index)>;

class Strategy {
 public:
  // Checks the plan's settings (a usage error for a bad --checkpoint-every).
  explicit Strategy(const StepPlan& plan);

  // Installs recomputation on the model's blocks, if the plan recomputes. Called once.
  void attach(Model& model);

  // Leaves the gradient of the mean per-target loss of the whole step (plan.accum_steps
  // micro-batches from `next`) in the parameters' .grad, accumulated onto what is there. Each
  // micro-batch's summed loss is divided by the target count of the whole step, never by the
  // number of micro-batches, so accumulation is exact with padded or masked targets.
  StepOutput compute_gradients(Model& model, const MicroBatchSource& next,
                               PhaseObserver& observer) const;

  const StepPlan& plan() const { return plan_; }
  // The installed checkpoint runner (its counters), null when nothing is recomputed.
  const CheckpointRunner* checkpoint_runner() const { return runner_.get(); }

 private:
  StepPlan plan_;
  std::shared_ptr<CheckpointRunner> runner_;
};

}  // namespace gradscope
