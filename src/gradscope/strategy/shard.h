// The optimizer step shared by several ranks (--shard), each rank running the same Strategy
// over its own share of every micro-batch (the step's loss normalized by the target count of
// all ranks, strategy.h), on the collectives of comm/comm.h:
//   - ddp: every rank holds every parameter, gradient and optimizer state; gradients are
//     all-reduced in buckets launched from the parameters' gradient hooks as buckets fill, so
//     communication overlaps the rest of backward; then the optimizer steps as after backward
//     (a line search's closure reduces its gradients the same way).
//   - zero1: the optimizer state covers only this rank's shard of the flat parameter space
//     (every parameter laid end to end); gradients are all-reduced as with ddp, each rank
//     updates its shard, and the updated shards are all-gathered into every rank's parameters.
//   - zero2: as zero1, but a bucket's gradients are freed once copied into its reduction
//     buffer, and after the reduction only this rank's shard of them is kept.
//   - fsdp (ZeRO-3): the parameters of each of the model's blocks are sharded as well, and
//     gathered whole only for the block's forward and again for its backward (a runner
//     installed on the model, and an autograd function on the block's output that gathers
//     when backward reaches it); the block's gradients are all-reduced as soon as its backward
//     ends, the shard kept, and the gathered parameters freed. Parameters outside the blocks
//     stay whole and are stepped as under zero2.
// A bucket is all-reduced whole and the shard taken from it (Gloo's reduce-scatter is an
// all-reduce and a chunk itself, and slower: `bench.py --only collectives`): the bucket's
// buffer is the transient memory of the collective, reported as its own component
// (ShardFigures::buffer_peak_bytes).
//
// With micro-batches, only the last one's backward reduces (the others accumulate locally),
// as PyTorch's no_sync. Elementwise optimizers work under every mode; those that need whole
// matrices or global sums work under ddp only, and are refused under zero with the reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "gradscope/core/config.h"
#include "gradscope/comm/comm.h"
#include "gradscope/models/model.h"
#include "gradscope/strategy/updater.h"

namespace gradscope {

// zero2 holds no whole gradient: at most this many buckets' buffers exist at once, the oldest
// waited for (and its shard taken) before another is made. The memory estimate replays it.
inline constexpr size_t kZero2BucketsInFlight = 2;

// What a sharded step measured, for the record (summed over the steps so far).
struct ShardFigures {
  int64_t reduced_bytes = 0;      // bytes of the buckets reduced
  int64_t overlapped_bytes = 0;   // of them, in buckets done when backward ended
  int64_t buffer_peak_bytes = 0;  // the most bytes of collective buffers alive at once
  int64_t shard_elements = 0;     // elements of this rank's shard (zero: the flat total / N)
  int64_t flat_elements = 0;      // elements of every trainable parameter, laid end to end
};

// Whether optimizer `name` works under `shard` (its update elementwise per entry); the
// refusal's reason otherwise ("" when it works).
std::string shard_refusal(Shard shard, const std::string& optimizer);

// The optimizers that work under every mode.
const std::vector<std::string>& elementwise_optimizers();

// A usage error for what a sharded step cannot do: the optimizer stepping in backward, or an
// optimizer that is not elementwise under zero1, zero2 or fsdp.
void check_shard(const StepPlan& plan, Shard shard, const std::string& optimizer);

// The Updater of a sharded step: options.comm names the ranks (at least one). A usage error
// for a combination it cannot honour. grad_reduce: how fsdp reduces its blocks' gradients
// (the other modes all-reduce).
std::unique_ptr<Updater> make_sharded_updater(const StepPlan& plan, Shard shard,
                                              const std::vector<torch::Tensor>& params,
                                              const OptimizerSpec& optimizer,
                                              const UpdaterOptions& options,
                                              std::shared_ptr<Communicator> comm,
                                              int64_t bucket_bytes, Model* model = nullptr,
                                              GradReduce grad_reduce = GradReduce::kAllReduce);

// The sharded updater's figures (null for an updater that is not sharded).
const ShardFigures* shard_figures(const Updater& updater);

}  // namespace gradscope
