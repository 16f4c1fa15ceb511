// `gradscope estimate`: a run's peak memory and FLOPs predicted without training, from a model
// of the computation (models/common/memory_trace.h): parameters, gradients and optimizer state
// from the architecture and the optimizer's update rule; activations by replaying what the
// step's forward allocates and autograd saves, under the run's strategy.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gradscope/core/config.h"
#include "gradscope/models/block_flops.h"

namespace gradscope {

struct MemoryEstimate {
  int64_t params_bytes = 0;         // every parameter, frozen ones included
  int64_t frozen_params_bytes = 0;  // of params_bytes, LoRA's frozen base
  int64_t grads_bytes = 0;
  int64_t optimizer_state_bytes = 0;
  int64_t optimizer_scratch_bytes = 0;  // temporaries of the update, largest parameter's
  // Of grads_bytes, those allocated at the backward's peak (one process, one micro-batch, a
  // gradient buffer; else grads_bytes): a peak early in backward has few of them.
  int64_t grads_at_backward_peak_bytes = 0;
  int64_t activations_bytes = 0;        // saved for backward when one micro-batch's forward ends
  // Of activations_bytes, what the loss head of a language model keeps for backward: the
  // logits of every position with --loss full (their gradient, made in forward); chunked, the
  // gradients of its input and of its weight (and bias), which it takes in forward.
  int64_t logits_bytes = 0;
  int64_t batch_bytes = 0;  // the batch and the model's cached tables
  int64_t data_bytes = 0;   // the data set held in memory (measured when loaded)
  // With several ranks (--nproc N with --shard), every figure here is one rank's: its share
  // of parameters, gradients and optimizer state, its micro-batch's activations, and the
  // buffers of its collectives. `sharded` is false for one process, or for a combination
  // whose sharded step is not modelled (notes say which): then the figures are one process's.
  bool sharded = false;
  int64_t nproc = 1;
  std::string shard = "none";
  int64_t flat_elements = 0;   // trainable parameter elements laid end to end (P)
  int64_t shard_elements = 0;  // one rank's share of them: P (ddp), ceil(P / N) (zero, fsdp)
  // The most collective buffers alive at once (buckets being reduced, shards being gathered,
  // fsdp's gathered blocks), as the run's record counts them.
  int64_t collective_buffers_bytes = 0;
  // Peaks of the phases, in bytes, everything included.
  int64_t forward_peak_bytes = 0;
  int64_t backward_peak_bytes = 0;
  int64_t optimizer_peak_bytes = 0;
  int64_t eval_peak_bytes = 0;
  int64_t comm_peak_bytes = 0;  // reductions after backward, gathers after the update; 0: none
  int64_t peak_bytes = 0;
  std::string peak_phase;
  // Analytical FLOPs per optimizer step: the model's (3 x forward) and the hardware's (with
  // the forward a checkpoint recomputes).
  double model_flops_per_step = 0;
  double hardware_flops_per_step = 0;
  // What checkpointing runs again, per step, in all and per tower (hardware - model).
  double recompute_flops_per_step = 0;
  std::map<std::string, double> recompute_flops_by_tower;
  std::vector<std::string> notes;
};

// Every block of the model (models/block_flops.h), in the order of model.blocks() (NanoVLM:
// the vision tower's blocks, then the decoder's), at sequence length `seq_len`; empty for a
// toy problem.
std::vector<BlockFlops> block_forward_flops(const std::string& model, const nlohmann::json& arch,
                                            int64_t seq_len);

// The forward FLOPs a step's checkpointing runs again in backward: for every wrapped block
// (0, k, 2k, ... of model.blocks() under --checkpoint-every k) the sub-layers its policy
// recomputes (both under full, one under attention or mlp), for every sample of the
// effective batch. 0 without recompute. Independent of the optimizer.
struct RecomputeFlops {
  double per_step = 0;
  std::map<std::string, double> by_tower;  // per step
};
RecomputeFlops recompute_flops(const RunConfig& config, const nlohmann::json& arch,
                               int64_t seq_len);

// The estimate for a run, for one of its ranks with --nproc N (--shard ddp, zero1, zero2 or
// fsdp; config.batch is that rank's micro-batch). `data_bytes`: what its data set holds in
// memory on the device (0 when it is elsewhere, e.g. on the host of a GPU run). Throws a usage
// error for a model, optimizer or strategy it has no model of.
MemoryEstimate estimate_run(const RunConfig& config, int64_t data_bytes);

nlohmann::json estimate_to_json(const MemoryEstimate& e);

// The run's trainable parameters in parameter order, as the sharded steps lay them out: each
// one's bytes and its block of model.blocks() (-1: outside the blocks).
struct ParamPlace {
  int64_t bytes = 0;
  int64_t block = -1;
};
std::vector<ParamPlace> trainable_param_places(const RunConfig& config);

// The largest micro-batch whose estimated peak fits `budget_bytes` (0 when even 1 does not):
// with several ranks, each rank's micro-batch within each rank's budget.
int64_t max_batch_within(RunConfig config, int64_t data_bytes, int64_t budget_bytes);

}  // namespace gradscope

namespace gradscope {

// Bytes the run's data set keeps in CPU memory once loaded, measured with the tracking
// allocator around loading it (0 when the run is not on the CPU, where the device's memory
// does not hold it). Loading errors propagate as usage errors.
int64_t resident_data_bytes(const RunConfig& config);

}  // namespace gradscope

namespace gradscope {

// The estimate's peak split as the memory timeline splits live bytes (component name ->
// bytes, core/memory_timeline.h): parameters, optimizer state, the batch and data set as
// other (with the update's scratch when the peak is the optimizer's), gradients as the replay
// had them at a backward peak and whole after it (none in forward, where the previous step's
// were freed), collective buffers
// with --shard, logits as the head keeps them, and activations the rest of the peak.
std::map<std::string, int64_t> estimate_breakdown_at_peak(const MemoryEstimate& e);

}  // namespace gradscope
