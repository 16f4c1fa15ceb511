// `gradscope verify`: proof that each memory strategy computes the gradient the math says.
// One step of every strategy from identical weights and data is compared with standard
// training on the whole effective batch (docs/strategies.md), once in float32 and once under
// bfloat16 autocast (--dtype bf16), each against the standard step in the same dtype:
// - checkpoint: bitwise equal gradients on the CPU in fp32 (relative <= 1e-5 under bf16,
//   where autocast's casts may reorder a float32 sum of gradient parts), with dropout 0.1
//   forced on (the recompute must draw the same dropout masks and, under bf16, cast the
//   weights as the forward did), whole blocks and, where the blocks expose them, the attention
//   and MLP branches alone (--checkpoint-policy attention, mlp). On CUDA, whose kernels may
//   sum in another order on a recompute: relative <= 1e-6 (fp32), <= 1e-2 (bf16: a few units
//   of bfloat16's rounding, 2^-8 relative, where an activation rounds the other way);
// - accumulation, checkpoint+accumulation: norm-wise ||a - b|| / ||b|| <= 1e-5 per tensor in
//   fp32, <= 2e-2 in bf16 (each micro-batch's products are rounded to bfloat16 apart, so a
//   weight's gradient sums k rounded parts instead of rounding one sum), dropout off
//   (micro-batches draw masks in a different order by construction);
// - fused, checkpoint+fused (strategies that step the optimizer in backward): the parameters
//   after one step against standard + the unfused optimizer (the run's optimizer if the fused
//   step supports it, else SGD), dropout 0.1: bitwise for SGD on CPU, else relative <= 1e-6
//   per tensor. The grad_* fields then describe parameter differences;
// - accumulation+fused, checkpoint+accumulation+fused (micro-batches folded into the optimizer
//   state in backward): one step of SGD with momentum 0.9, without and with weight decay 0.1,
//   against standard + SGD on the whole effective batch, dropout off: the parameters within
//   1e-6 per tensor in fp32 (their float32 rounding), in bf16 what the step moved them by
//   within 2e-2 (each micro-batch's products rounded apart). Adam's fold (AdamA) is another
//   rule and is not compared with Adam.
// - with VerifyOptions::chunked_loss or --loss chunked, on models with a language-model head:
//   standard and each strategy again with the loss taken over chunks of positions (--loss
//   chunked; --loss-chunk, else 37 positions, a prime that leaves a partial last chunk),
//   against the same full-loss reference: relative <= 1e-5 in fp32 and 2e-2 in bf16 (the
//   chunks reorder sums over positions; under bf16 each chunk's weight-gradient product is
//   rounded to bfloat16 apart), added to the strategy's own tolerance; never bitwise (fused:
//   the parameters after the step, as above). accumulation+fused: the full loss only.
// - with VerifyOptions::attention, on models with attention: standard and each strategy again
//   with --attention sdpa, dropout off, against standard training with --attention math:
//   relative <= 1e-5 in fp32 and 2e-2 in bf16 (the fused kernel reorders the softmax's sums;
//   under bf16 the math path rounds scores and weights to bfloat16 where the kernel keeps them
//   in float32), added to the strategy's own tolerance. The fused strategies are compared as
//   their own checks are: the parameters after one SGD step (within 1e-6 plus the attention
//   tolerance), the fold's updates (within 2e-2 plus it); these check that the fused step takes
//   the kernel's gradients, which the standard twin checks themselves. And with dropout 0.1
//   each checkpointing
//   strategy with --attention sdpa against standard with it: bitwise in fp32 on the CPU (the
//   recompute draws SDPA's own dropout masks again).
// - with VerifyOptions::saved_input or --saved-input bf16: each checkpointing strategy (not
//   accumulating, not fused) again with its kept input rounded to bfloat16, dropout 0.1, against
//   the checkpoint's reference: a lossy method, relative <= 2e-2 (the recompute runs from an
//   input within 2^-9 of the forward's; verify.cpp derives it), plus the recompute's own
//   tolerance under bf16 autocast or on CUDA; never bitwise.
// A gradient check also fails when a parameter is left without a gradient (a recompute that
// lost a weight's graph, say).
// Every model is built by the session (session.h), as a run builds it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gradscope/core/config.h"
#include "gradscope/comm/comm.h"
#include "gradscope/models/model.h"

namespace gradscope {

struct VerifyCheck {
  std::string strategy;
  Dtype dtype = Dtype::kFp32;
  std::string criterion;     // "bitwise" or "relative <= 1e-05"; "params ..." for fused
  double loss_abs_diff = 0;  // |loss - reference loss|
  double loss_rel_diff = 0;
  double grad_max_abs_diff = 0;  // over every element of every gradient
  double grad_max_rel_diff = 0;  // worst tensor's ||a - b|| / ||b||
  std::string worst_tensor;      // name of that tensor, or of the first without a gradient
  int64_t tensors = 0;
  int64_t missing_grads = 0;  // parameters the strategy left without a gradient
  bool passed = false;
};

struct VerifyOptions {
  // Strategy names; every shorthand but standard when empty.
  std::vector<std::string> strategies;
  // The dtypes to check in; fp32 and then bf16 when empty.
  std::vector<Dtype> dtypes;
  // Called with each model verify builds (references included), after its session installed
  // the plan's recomputation and before its step: tests break a recompute here to show that
  // the checks catch it. Empty in every real use.
  std::function<void(Model& model, const StepPlan& plan)> instrument;
  // Also check the chunked loss (the `gradscope verify` command does); the checks run anyway
  // when the config says --loss chunked, and never on models without a language-model head.
  bool chunked_loss = false;
  // Also check --attention sdpa against --attention math (the `gradscope verify` command
  // does), on every model with attention.
  bool attention = false;
  // Also check --saved-input bf16 with each checkpointing strategy (the `gradscope verify`
  // command does); the checks run anyway when the config says --saved-input bf16.
  bool saved_input = false;
};

// Runs the checks of `options`, grouped by dtype. The config gives model, preset, batch,
// accum steps (at least 2 is used for accumulating strategies), seed and device; its dtype is
// ignored (options.dtypes says which).
std::vector<VerifyCheck> verify_strategies(const RunConfig& config, const VerifyOptions& options);
// With several ranks (config.nproc, comm the ranks met): every --shard mode the optimizer
// allows (fsdp with both --grad-reduce), kShardSteps steps of N ranks with micro-batch b (config.batch) against one process
// with micro-batch N b, dropout off: the losses of every step and what the steps moved each
// parameter by, relative <= 1e-5 in fp32 and 2e-2 in bf16 (the ranks reorder the batch's sums;
// verify.cpp derives it). Every rank runs the same checks and gets the same results.
std::vector<VerifyCheck> verify_sharding(const RunConfig& config,
                                         const std::shared_ptr<Communicator>& comm,
                                         const VerifyOptions& options);
// The checks of `strategies` in both dtypes.
std::vector<VerifyCheck> verify_strategies(const RunConfig& config,
                                           const std::vector<std::string>& strategies);

}  // namespace gradscope
