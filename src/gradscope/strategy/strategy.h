// Memory strategies own how the gradient of one optimizer step is computed: how the
// effective batch is split into micro-batches and what is kept or recomputed. They never
// read a clock: they announce phase changes to an observer, and the training loop times them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "gradscope/core/config.h"
#include "gradscope/core/registry.h"
#include "gradscope/models/model.h"

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
  virtual ~Strategy() = default;
  // Installs what the strategy needs on the model (e.g. a block runner). Called once.
  virtual void attach(Model& model) {}
  // Leaves the gradient of the mean per-target loss of the whole step in the parameters'
  // .grad. The loss is never divided by the number of micro-batches.
  virtual StepOutput compute_gradients(Model& model, int64_t micro_batches,
                                       const MicroBatchSource& next, PhaseObserver& observer) = 0;

  // A strategy that steps the optimizer itself (the fused step) updates the parameters during
  // compute_gradients and leaves no gradient behind; the training loop then builds no
  // optimizer of its own and calls none of optimizer.step(), clipping or the gradient norm.
  virtual bool steps_optimizer() const { return false; }
  // Builds the optimizer it steps, from the run's --optimizer, --weight-decay and --opt
  // settings (a usage error when they are bad). Called once, after attach.
  virtual void attach_optimizer(const std::vector<torch::Tensor>& params, const RunConfig& config,
                                double lr) {}
  // The learning rate of the optimizer it steps (the schedule's value for the coming step).
  virtual void set_learning_rate(double lr) {}
  // Bytes of the state of the optimizer it steps (momentum, moments, accumulators).
  virtual int64_t optimizer_state_bytes() const { return 0; }
};

struct StrategyEntry {
  // Builds the strategy for a run; refuses settings it cannot honour (a usage error).
  std::unique_ptr<Strategy> (*make)(const RunConfig& config);
  bool uses_micro_batches;       // whether --accum-steps > 1 is meaningful
  bool steps_optimizer = false;  // whether it updates the parameters itself (Strategy above)
};
const Registry<StrategyEntry>& strategy_registry();

}  // namespace gradscope
