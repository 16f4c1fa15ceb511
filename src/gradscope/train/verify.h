// `gradscope verify`: proof that each memory strategy computes the gradient the math says.
// One step of every strategy from identical weights and data is compared with standard
// training on the whole effective batch (docs/strategies.md):
// - checkpoint: bitwise equal gradients on CPU fp32, with dropout 0.1 forced on (the recompute
//   must draw the same dropout masks), whole blocks and, where the blocks expose them, the
//   attention and MLP branches alone (--checkpoint-policy attention, mlp);
// - accumulation, checkpoint+accumulation: norm-wise ||a - b|| / ||b|| <= 1e-5 per tensor,
//   dropout off (micro-batches draw masks in a different order by construction).
// - fused, checkpoint+fused (strategies that step the optimizer in backward): the parameters
//   after one step against standard + the unfused optimizer (the run's optimizer if the fused
//   step supports it, else SGD), dropout 0.1: bitwise for SGD on CPU, else relative <= 1e-6
//   per tensor. The grad_* fields then describe parameter differences.
// Every model is built by the session (session.h), as a run builds it.
#pragma once

#include <string>
#include <vector>

#include "gradscope/core/config.h"

namespace gradscope {

struct VerifyCheck {
  std::string strategy;
  std::string criterion;     // "bitwise" or "relative <= 1e-05"; "params ..." for fused
  double loss_abs_diff = 0;  // |loss - reference loss|
  double loss_rel_diff = 0;
  double grad_max_abs_diff = 0;  // over every element of every gradient
  double grad_max_rel_diff = 0;  // worst tensor's ||a - b|| / ||b||
  std::string worst_tensor;      // name of that tensor
  int64_t tensors = 0;
  bool passed = false;
};

// Runs the checks for `strategies` (strategy names; every shorthand but standard when empty).
// The config gives model, preset, batch, accum steps (at least 2 is used for accumulating
// strategies), seed and device.
std::vector<VerifyCheck> verify_strategies(const RunConfig& config,
                                           const std::vector<std::string>& strategies);

}  // namespace gradscope
