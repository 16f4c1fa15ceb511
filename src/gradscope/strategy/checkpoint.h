// Gradient checkpointing (activation recomputation, Chen et al. 2016, "Training Deep Nets
// with Sublinear Memory Cost"), reentrant form: a wrapped block runs its forward without
// recording a graph, keeping only its input; in backward it is run again with the graph
// recorded and back-propagated through, so its activations live only while its own
// gradient is computed.
//
// Exactness: the recompute must see the same random numbers as the forward, or dropout
// draws other masks and the gradient is of another function. The forward saves the state
// of the default CPU generator (and of the default CUDA generator of the input's device);
// the backward sets it before recomputing and puts back the state it found afterwards, so
// the recompute draws the same masks and the rest of the run sees the same random stream as
// without checkpointing. On the CPU in fp32 the gradients are then bitwise equal to plain
// backward.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include <torch/torch.h>

#include "gradscope/core/config.h"
#include "gradscope/models/model.h"

namespace gradscope {

// Counts kept by a checkpoint runner (shared with the backward nodes it creates).
struct CheckpointCounters {
  // Forwards of wrapped functions (whole blocks, or the chosen sub-layers under a selective
  // policy) run without a graph.
  int64_t checkpointed = 0;
  int64_t plain = 0;       // block forwards run as usual (not wrapped, selective, or no grad)
  int64_t recomputed = 0;  // wrapped forwards run again in backward
};

struct CheckpointOptions {
  int64_t every = 1;  // wrap blocks 0, k, 2k, ... (every k-th block, the first included)
  // What a wrapped block recomputes: full, attention or mlp (never none).
  Recompute policy = Recompute::kFull;
  // kBf16 (--saved-input bf16): a wrapped function keeps its input rounded to bfloat16 until
  // backward (half the bytes of a float32 input) and the recompute runs from the rounded
  // input, so the gradients are those at a point within bfloat16's rounding of the forward's
  // (approximate; `gradscope verify` bounds them). The forward itself, and so the loss, runs
  // on the input as computed. An input already 16-bit or narrower is kept as it is.
  Dtype saved_input = Dtype::kFp32;
  // Test switch: false skips saving and restoring the generator state, so the recompute
  // draws fresh dropout masks. Only tests turn it off, to show that the restore matters.
  bool restore_rng = true;
};

// Runs block.forward(x, ctx) through the checkpoint function: no activations are kept but x
// (and ctx's tensors, which are shared, not copied); backward recomputes the block and
// accumulates its parameters' gradients. When x does not require grad, the function is
// still recorded (otherwise autograd would skip it and the block's parameters would get no
// gradient), and no gradient is computed for x. The block must outlive the backward pass.
// Under NoGradGuard (evaluation) the block simply runs.
// (B, T, C) -> (B, T, C)
// `saved_input` is CheckpointOptions::saved_input.
torch::Tensor checkpoint_block(Block& block, const torch::Tensor& x, const BlockContext& ctx,
                               bool restore_rng = true,
                               const std::shared_ptr<CheckpointCounters>& counters = nullptr,
                               Dtype saved_input = Dtype::kFp32);

// Runs fn(x) through the checkpoint function, as checkpoint_block does for a whole block:
// only x is kept, and backward runs fn again. fn must own what it uses (capture by value).
torch::Tensor checkpoint_function(const SubLayerFn& fn, const torch::Tensor& x,
                                  bool restore_rng = true,
                                  const std::shared_ptr<CheckpointCounters>& counters = nullptr,
                                  Dtype saved_input = Dtype::kFp32);

// A BlockRunner that checkpoints every k-th block of a model, chosen by position in
// model.blocks(). Blocks it does not know run as usual. With the attention or mlp policy it
// instead installs a sub-layer runner on each chosen block (Block::set_sublayer_runner) that
// checkpoints only that branch; a block that does not expose sub-layers is a usage error.
class CheckpointRunner {
 public:
  CheckpointRunner(const std::vector<std::shared_ptr<Block>>& blocks, CheckpointOptions options);

  // `inner` (empty: block.forward) runs the block with the runner layers inside this one; a
  // wrapped block's forward and its recompute both go through it.
  torch::Tensor operator()(Block& block, const torch::Tensor& x, const BlockContext& ctx,
                           const BlockRunner& inner = nullptr);

  const CheckpointOptions& options() const { return options_; }
  const CheckpointCounters& counters() const { return *counters_; }
  void reset_counters() { *counters_ = CheckpointCounters{}; }
  // Whether block `index` of model.blocks() is wrapped.
  bool wraps(int64_t index) const { return index % options_.every == 0; }

 private:
  CheckpointOptions options_;
  std::unordered_set<const Block*> wrapped_;
  std::shared_ptr<CheckpointCounters> counters_;
};

// The checkpoint settings of a step plan that recomputes (--recompute, --checkpoint-every).
CheckpointOptions checkpoint_options(const StepPlan& plan);
// A usage error unless `every` is at least 1 and the policy recomputes something.
void check_checkpoint_options(const CheckpointOptions& options);

// Builds a runner for `model`'s blocks and installs it at the model's recompute layer
// (RunnerLayer::kRecompute, inside sharding's). The returned runner is shared with the model
// (for its counters). The options are checked as by check_checkpoint_options.
std::shared_ptr<CheckpointRunner> install_checkpointing(Model& model, CheckpointOptions options);

}  // namespace gradscope
