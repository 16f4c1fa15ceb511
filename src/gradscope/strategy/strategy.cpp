#include "gradscope/strategy/strategy.h"

#include "gradscope/core/error.h"
#include "gradscope/strategy/builtin.h"
#include "gradscope/strategy/checkpoint.h"

namespace gradscope {

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kPhaseData:
      return "data";
    case Phase::kPhaseForward:
      return "forward";
    case Phase::kPhaseBackward:
      return "backward";
    case Phase::kPhaseOptimizer:
      return "optimizer";
    default:
      return "unknown";
  }
}

namespace {

// Standard training: the whole effective batch in one forward and one backward.
class StandardStrategy : public Strategy {
 public:
  explicit StandardStrategy(std::string name) : name_(std::move(name)) {}

  StepOutput compute_gradients(Model& model, int64_t micro_batches, const MicroBatchSource& next,
                               PhaseObserver& observer) override {
    check_usage(micro_batches == 1,
                "strategy '" + name_ + "' computes a step in one batch, got --accum-steps " +
                    std::to_string(micro_batches),
                "use --accum-steps 1, or a strategy that accumulates micro-batches");
    observer.enter(Phase::kPhaseData);
    Batch batch = next(0);
    observer.enter(Phase::kPhaseForward);
    LossOutput out = model.loss(batch);
    // Mean per target over the effective batch.
    torch::Tensor loss = out.loss_sum / static_cast<double>(std::max<int64_t>(out.target_count, 1));
    observer.enter(Phase::kPhaseBackward);
    loss.backward();
    StepOutput step;
    step.loss_sum = out.loss_sum.detach();
    step.target_count = out.target_count;
    step.samples = batch.samples;
    step.tokens = batch.tokens;
    return step;
  }

 private:
  std::string name_;
};

// Standard training with checkpointed blocks: the blocks' activations are dropped in the
// forward and recomputed in the backward.
class CheckpointStrategy : public StandardStrategy {
 public:
  explicit CheckpointStrategy(CheckpointOptions options)
      : StandardStrategy("checkpoint"), options_(options) {}
  void attach(Model& model) override { install_checkpointing(model, options_); }

 private:
  CheckpointOptions options_;
};

}  // namespace

std::unique_ptr<Strategy> make_standard(const RunConfig&) {
  return std::make_unique<StandardStrategy>("standard");
}

std::unique_ptr<Strategy> make_checkpoint(const RunConfig& config) {
  return std::make_unique<CheckpointStrategy>(checkpoint_options(config));
}

const Registry<StrategyEntry>& strategy_registry() {
  static const Registry<StrategyEntry> registry = [] {
    Registry<StrategyEntry> r("strategy");
    r.add("standard", "one forward and one backward over the whole batch", {make_standard, false});
    r.add("checkpoint", "standard, recomputing every k-th block in backward instead of storing it",
          {make_checkpoint, false});
    r.add("accumulation", "k micro-batches per step, gradients summed, exact per-target mean",
          {make_accumulation, true});
    r.add("checkpoint+accumulation", "accumulation with every k-th block recomputed in backward",
          {make_checkpoint_accumulation, true});
    r.add("fused", "standard, each parameter updated in backward and its gradient freed at once",
          {make_fused, false, true});
    return r;
  }();
  return registry;
}

}  // namespace gradscope
