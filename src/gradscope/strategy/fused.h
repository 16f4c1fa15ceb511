// The optimizer step in backward (--optimizer-step in-backward, the `fused` strategy): each
// parameter is updated as soon as its gradient is complete, and the gradient freed at once.
#pragma once

#include <memory>
#include <vector>

#include <torch/torch.h>

#include "gradscope/strategy/updater.h"

namespace gradscope {

// Refuses (a usage error) optimizers whose update is not per parameter, and clipping (which
// needs the norm of every gradient before any update). With micro-batches the updater folds
// each micro-batch's gradient into the optimizer state (optim/micro_batch_fold.h) and is also
// its strategy's MicroBatchListener; it refuses optimizers whose state cannot take a fold (all
// but sgd with momentum, adam and adamw; Nesterov) and clipping.
std::unique_ptr<Updater> make_in_backward_updater(const StepPlan& plan,
                                                  const std::vector<torch::Tensor>& params,
                                                  const OptimizerSpec& optimizer,
                                                  const UpdaterOptions& options);

}  // namespace gradscope
