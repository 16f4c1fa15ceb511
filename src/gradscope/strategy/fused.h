// The optimizer step in backward (--optimizer-step in-backward, the `fused` strategy): each
// parameter is updated as soon as its gradient is complete, and the gradient freed at once.
#pragma once

#include <memory>
#include <vector>

#include <torch/torch.h>

#include "gradscope/strategy/updater.h"

namespace gradscope {

// Refuses (a usage error) optimizers whose update is not per parameter, clipping (which needs
// the norm of every gradient before any update) and micro-batches (a parameter would be
// updated after the first micro-batch's backward).
std::unique_ptr<Updater> make_in_backward_updater(const StepPlan& plan,
                                                  const std::vector<torch::Tensor>& params,
                                                  const OptimizerSpec& optimizer,
                                                  const UpdaterOptions& options);

}  // namespace gradscope
