// The step's gradient over its micro-batches.
//
// Exactness: the step's gradient must be that of the mean per-target loss over the whole
// effective batch. Each micro-batch's summed loss is divided by the target count of the
// whole step (not by its own count and then by k: with padded or masked targets the counts
// differ, and a mean of means weights the targets of short micro-batches more). That count
// must be known before the first backward, so the k micro-batches are fetched first, and
// held on the host until their turn: each is moved to the device just before its forward and
// dropped after its backward, so the device holds one micro-batch's inputs at a time (with
// images, holding all k there would spend k times the input memory accumulation saves).
// Each batch knows its target count on the CPU (the data source counts it), so the step
// needs no device synchronization to learn it. With one micro-batch this is standard
// training: one forward and one backward over the whole batch.
#include "gradscope/strategy/strategy.h"

#include <utility>

#include <fmt/format.h>

#include "gradscope/core/error.h"

namespace gradscope {

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kData:
      return "data";
    case Phase::kForward:
      return "forward";
    case Phase::kBackward:
      return "backward";
    case Phase::kOptimizer:
      return "optimizer";
    case Phase::kComm:
      return "communication";
    default:
      return "unknown";
  }
}

Strategy::Strategy(const StepPlan& plan) : plan_(plan) {
  check_usage(plan_.accum_steps >= 1,
              fmt::format("--accum-steps {} must be positive", plan_.accum_steps),
              "pass --accum-steps with a value of at least 1");
  if (plan_.recompute != Recompute::kNone)
    check_checkpoint_options(checkpoint_options(plan_));
}

void Strategy::attach(Model& model) {
  // The memory methods that act inside the model's forward: the block runner's layers
  // (RunnerLayer: recomputation here, sharding's gathers from its updater) and the loss head.
  if (plan_.recompute != Recompute::kNone)
    runner_ = install_checkpointing(model, checkpoint_options(plan_));
  LossOptions loss = model.loss_options();
  loss.chunked = plan_.loss == LossKind::kChunked;
  loss.chunk_rows = plan_.loss_chunk;
  model.set_loss_options(std::move(loss));
}

StepOutput Strategy::compute_gradients(Model& model, const MicroBatchSource& next,
                                       PhaseObserver& observer) const {
  const int64_t k = plan_.accum_steps;
  // All micro-batches first, on the host, so that the step's target count is known before
  // any backward.
  std::vector<Batch> host;
  host.reserve(static_cast<size_t>(k));
  int64_t total = 0;
  for (int64_t i = 0; i < k; ++i) {
    observer.enter(Phase::kData);
    host.push_back(next.fetch(i));
    total += host.back().targets_count;
  }
  // Every rank's targets: each normalizes by the count of the whole step (masked language
  // models count differently on each rank).
  if (comm_) total = comm_->sum(total);
  const double denominator = static_cast<double>(std::max<int64_t>(total, 1));

  StepOutput step;
  step.target_count = total;
  for (int64_t i = 0; i < k; ++i) {
    // The first move belongs to the data phase still running; a later one starts it again.
    if (i > 0) observer.enter(Phase::kData);
    Batch batch = std::move(host[static_cast<size_t>(i)]);
    host[static_cast<size_t>(i)] = Batch();
    if (next.to_device) batch = next.to_device(batch);  // the host copy is dropped here
    observer.enter(Phase::kForward);
    LossOutput out = model.loss(batch);
    if (out.target_count != batch.targets_count)
      fail_runtime(fmt::format("micro-batch {} has {} targets but the model counted {}, so the "
                               "step's loss cannot be normalized exactly",
                               i, batch.targets_count, out.target_count),
                   "the model must take its loss over targets other than kIgnoreIndex");
    // This micro-batch's share of the mean per target over the whole effective batch.
    torch::Tensor loss = out.loss_sum / denominator;
    observer.enter(Phase::kBackward);
    const MicroBatchInfo info{i, k, batch.targets_count, total};
    if (listener_) listener_->before_backward(info);
    loss.backward();
    if (listener_) listener_->after_backward(info);
    const torch::Tensor summed = out.loss_sum.detach();
    step.loss_sum = step.loss_sum.defined() ? step.loss_sum + summed : summed;
    step.samples += batch.samples;
    step.tokens += batch.tokens;
    // Its inputs leave the device before the next one arrives (the graph that also held
    // them was freed by backward).
    out = LossOutput();
    loss = torch::Tensor();
    batch = Batch();
  }
  if (comm_) {
    // The step as one process would report it: sums over every rank.
    torch::Tensor sums =
        torch::stack({step.loss_sum.to(torch::kCPU, torch::kFloat64),
                      torch::tensor(static_cast<double>(step.samples), torch::kFloat64),
                      torch::tensor(static_cast<double>(step.tokens), torch::kFloat64)})
            .to(comm_->device());
    comm_->allreduce(sums);
    sums = sums.cpu();
    step.loss_sum = sums[0].to(step.loss_sum.device(), step.loss_sum.scalar_type());
    step.samples = static_cast<int64_t>(sums[1].item<double>());
    step.tokens = static_cast<int64_t>(sums[2].item<double>());
  }
  return step;
}

}  // namespace gradscope
