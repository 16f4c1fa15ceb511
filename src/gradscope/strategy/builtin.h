// The strategies gradscope ships, for strategy_registry(). Each make function checks the
// settings of the run it is given and refuses those it cannot honour (a usage error).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gradscope/core/config.h"
#include "gradscope/strategy/strategy.h"

namespace gradscope {

// One forward and one backward over the whole batch.
std::unique_ptr<Strategy> make_standard(const RunConfig& config);
// Standard, with every --checkpoint-every-th block recomputed in backward.
std::unique_ptr<Strategy> make_checkpoint(const RunConfig& config);
// --accum-steps micro-batches, gradients accumulated, normalized by the step's target count.
std::unique_ptr<Strategy> make_accumulation(const RunConfig& config);
// Accumulation with checkpointed blocks.
std::unique_ptr<Strategy> make_checkpoint_accumulation(const RunConfig& config);
// Standard, with each parameter's optimizer step run in backward as soon as its gradient has
// been accumulated, and the gradient then freed. Refuses clipping and other optimizers.
std::unique_ptr<Strategy> make_fused(const RunConfig& config);
// The optimizers the fused step supports (their updates are elementwise per parameter).
const std::vector<std::string>& fused_optimizers();

}  // namespace gradscope
