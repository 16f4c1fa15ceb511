// The one seam through which a way of computing a step owns the optimizer step. The training
// loop hands an Updater a function that computes the step's gradients (through the Strategy,
// with the loop's autocast) and gets back what they were computed from; the Updater decides
// when the optimizer steps:
//   - after backward (the default): gradients computed, the global norm taken where clipping
//     or the record needs it, clipped, one optimizer step over all parameters; an optimizer
//     with a line search (cg) is handed the gradient function as its closure instead;
//   - in backward (the fused step, fused.cpp): each parameter is updated by an optimizer of
//     its own as soon as its gradient is complete, and the gradient freed at once; with
//     micro-batches, each micro-batch's gradient is folded into the optimizer state and freed,
//     and the parameter updated after the last one (accumulation without a gradient buffer).
// Either way no gradient is left behind when step() returns, so memory figures do not depend
// on whether an optimizer's zero_grad zeroes the gradients in place or frees them.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "gradscope/core/config.h"
#include "gradscope/strategy/strategy.h"

namespace gradscope {

// What builds the optimizer an Updater steps: the run's --optimizer, learning rate, --weight-
// decay and --opt settings.
struct OptimizerSpec {
  std::string name = "adam";
  double lr = 1e-3;
  double weight_decay = 0;
  std::map<std::string, std::string> opt;
  // The parameters' names in the model and their attention head sizes, in the order
  // make_updater gets them (ParamInfo, optim/factory.h; empty: unknown).
  std::vector<std::string> param_names = {};
  std::vector<int64_t> param_head_sizes = {};
};

struct UpdaterOptions {
  double clip_grad_norm = 0;  // 0 = off
  bool log_grad_norm = true;  // take the global gradient norm of every step for the record
};

struct UpdateResult {
  StepOutput out;  // of the step's first gradient computation
  // The global L2 norm of all gradients before clipping; NaN when not taken (not asked for,
  // or no buffer of every gradient exists: the fused step).
  double grad_norm = std::numeric_limits<double>::quiet_NaN();
  int64_t evaluations = 0;  // gradient computations over the step's batch
};

// Computes the step's gradients (announcing data, forward and backward to the observer).
using GradientFn = std::function<StepOutput()>;

class Updater {
 public:
  virtual ~Updater() = default;
  // Computes the step's gradients with `gradients` (once, or at each trial point of a line
  // search) and updates the parameters; enters the optimizer phase on `observer`. Leaves no
  // gradient behind.
  virtual UpdateResult step(const GradientFn& gradients, PhaseObserver& observer) = 0;
  // The learning rate of the coming step (the schedule's value).
  virtual void set_learning_rate(double lr) = 0;
  // Bytes of the optimizer state (momentum, moments, accumulators).
  virtual int64_t state_bytes() const = 0;
  // The tensors of that state (what the memory timeline names optimizer state).
  virtual std::vector<torch::Tensor> state_tensors() const = 0;
  // Bytes of every gradient at once, measured at the first step; nullopt where they never
  // exist at once (the fused step) or before the first step.
  virtual std::optional<int64_t> grads_bytes() const = 0;
  // What must hear of each micro-batch before its backward (Strategy::set_micro_batch_listener):
  // an updater that folds micro-batches into the optimizer state in backward; null otherwise.
  virtual MicroBatchListener* micro_batch_listener() { return nullptr; }
  // The update rule where it is not the optimizer's own ("adama": Adam's second moment
  // accumulated per micro-batch); nullopt when the parameters move as the optimizer says.
  virtual std::optional<std::string> update_rule() const { return std::nullopt; }
  // The optimizer state, written between steps and read back into an updater built from the
  // same settings over the same parameters (a training state, train/train_state.h). Whatever
  // else an updater keeps lasts one step only.
  virtual void save(torch::serialize::OutputArchive& archive) const = 0;
  virtual void load(torch::serialize::InputArchive& archive) = 0;
  // Where parameters live sharded over ranks (fsdp): gather_parameters makes every model
  // parameter hold its whole value (a collective: every rank calls it), scatter_parameters
  // takes each rank's share of them back as the truth and frees the rest. A save or load of
  // the model's weights goes between the two. Nothing for other updaters.
  virtual void gather_parameters() {}
  virtual void scatter_parameters() {}
  // The parameter bytes this rank holds between steps, where that is not every parameter.
  virtual std::optional<int64_t> resident_params_bytes() const { return std::nullopt; }
  // Parameters it holds outside the model's own tensors, by name (fsdp's shards); none by
  // default.
  virtual std::vector<std::pair<std::string, torch::Tensor>> parameter_shards() const {
    return {};
  }
};

// The Updater of a step plan for these parameters. A usage error for settings it cannot honour
// (the fused step with an optimizer whose update is not per parameter, or with clipping).
std::unique_ptr<Updater> make_updater(const StepPlan& plan,
                                      const std::vector<torch::Tensor>& params,
                                      const OptimizerSpec& optimizer,
                                      const UpdaterOptions& options);

// The optimizers the fused step supports (their updates are elementwise per parameter).
const std::vector<std::string>& fused_optimizers();
// The optimizers the fused step supports with micro-batches (their state can take a fold).
const std::vector<std::string>& folding_optimizers();

}  // namespace gradscope
