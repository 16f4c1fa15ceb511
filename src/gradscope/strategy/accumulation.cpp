// Gradient accumulation: the effective batch of a step is split into k micro-batches, each
// run forward and backward in turn, the gradients summing in the parameters' .grad.
//
// Exactness: the step's gradient must be that of the mean per-target loss over the whole
// effective batch. Each micro-batch's summed loss is divided by the target count of the
// whole step (not by its own count and then by k: with padded or masked targets the counts
// differ, and a mean of means weights the targets of short micro-batches more). That count
// must be known before the first backward, so the k micro-batches are fetched first (their
// inputs are held until their turn: index tensors for text, small beside the activations).
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gradscope/core/error.h"
#include "gradscope/strategy/builtin.h"
#include "gradscope/strategy/checkpoint.h"

namespace gradscope {
namespace {

// Targets of a micro-batch, counted before its forward as the models count them: positions
// of `targets` (else `labels`) other than kIgnoreIndex, else the batch's own targets_count.
// () int64 on the batch's device (the CPU for the last case).
torch::Tensor count_targets(const Batch& batch) {
  if (batch.targets.defined()) return batch.targets.ne(kIgnoreIndex).sum();
  if (batch.labels.defined()) return batch.labels.ne(kIgnoreIndex).sum();
  // A batch without target tensors (a toy problem's) states its count.
  if (batch.targets_count > 0) return torch::full({}, batch.targets_count, torch::kLong);
  fail_runtime("a micro-batch has neither targets nor labels, so its targets cannot be counted",
               "this model's batches do not support gradient accumulation");
}

class AccumulationStrategy : public Strategy {
 public:
  AccumulationStrategy(std::string name, std::optional<CheckpointOptions> checkpoint)
      : name_(std::move(name)), checkpoint_(checkpoint) {}

  void attach(Model& model) override {
    if (checkpoint_) install_checkpointing(model, *checkpoint_);
  }

  StepOutput compute_gradients(Model& model, int64_t micro_batches, const MicroBatchSource& next,
                               PhaseObserver& observer) override {
    check_usage(micro_batches >= 1,
                fmt::format("strategy '{}' needs at least one micro-batch, got --accum-steps {}",
                            name_, micro_batches),
                "pass --accum-steps 1 or more");
    // All micro-batches first, so that the step's target count is known before any backward.
    std::vector<Batch> batches;
    std::vector<torch::Tensor> counts;
    batches.reserve(static_cast<size_t>(micro_batches));
    counts.reserve(static_cast<size_t>(micro_batches));
    for (int64_t i = 0; i < micro_batches; ++i) {
      observer.enter(Phase::kPhaseData);
      batches.push_back(next(i));
      counts.push_back(count_targets(batches.back()));
    }
    // One read from the device for all counts.
    const torch::Tensor counts_cpu = torch::stack(counts).to(torch::kCPU);  // (k) int64
    const auto count_at = counts_cpu.accessor<int64_t, 1>();
    int64_t total = 0;
    for (int64_t i = 0; i < micro_batches; ++i) total += count_at[i];
    const double denominator = static_cast<double>(std::max<int64_t>(total, 1));

    StepOutput step;
    step.target_count = total;
    for (int64_t i = 0; i < micro_batches; ++i) {
      Batch& batch = batches[static_cast<size_t>(i)];
      observer.enter(Phase::kPhaseForward);
      LossOutput out = model.loss(batch);
      if (out.target_count != count_at[i])
        fail_runtime(fmt::format("micro-batch {} has {} targets but the model counted {}, so the "
                                 "step's loss cannot be normalized exactly",
                                 i, count_at[i], out.target_count),
                     "the model must take its loss over targets other than kIgnoreIndex");
      // This micro-batch's share of the mean per target over the whole effective batch.
      torch::Tensor loss = out.loss_sum / denominator;
      observer.enter(Phase::kPhaseBackward);
      loss.backward();
      const torch::Tensor summed = out.loss_sum.detach();
      step.loss_sum = step.loss_sum.defined() ? step.loss_sum + summed : summed;
      step.samples += batch.samples;
      step.tokens += batch.tokens;
      batch = Batch();  // its inputs are no longer needed
    }
    return step;
  }

 private:
  std::string name_;
  std::optional<CheckpointOptions> checkpoint_;
};

}  // namespace

std::unique_ptr<Strategy> make_accumulation(const RunConfig&) {
  return std::make_unique<AccumulationStrategy>("accumulation", std::nullopt);
}

std::unique_ptr<Strategy> make_checkpoint_accumulation(const RunConfig& config) {
  return std::make_unique<AccumulationStrategy>("checkpoint+accumulation",
                                                checkpoint_options(config));
}

}  // namespace gradscope
