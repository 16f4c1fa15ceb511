// `gradscope estimate --link`: what the collectives of each shard mode cost per step on a
// given interconnect, predicted from the same bucket and in-flight rules the sharded steps
// follow (strategy/shard.cpp, fsdp.cpp) and from the model's FLOPs at a stated device
// throughput. docs/distributed.md, "What a link will cost", says what is modelled and how it
// compares with the emulated links of this machine.
//
// The model, per rank and per step:
//   - collectives as gradscope issues them, every one a ring (Gloo's and NCCL's algorithm for
//     these sizes): an all-reduce of n bytes takes 2(N-1) rounds of n/N bytes, an all-gather
//     of s bytes per rank N-1 rounds of s; a round costs the latency plus its bytes over the
//     slowest link of the ring (the inter-node link with several nodes: each node has one
//     ring edge to the next);
//   - gradients all-reduced whole in buckets (no reduce-scatter: gradscope issues none, on
//     Gloo, whose reduce-scatter is itself an all-reduce, or on NCCL), launched in order as
//     backward completes them; zero2's (and fsdp's parameters outside the blocks) at most
//     kZero2BucketsInFlight at once, backward waiting for the oldest;
//   - fsdp gathers each block before its forward and again before its backward, and
//     all-reduces its gradients when its backward ends, each time waiting; zero and fsdp
//     gather the updated shards after the optimizer's step, waiting;
//   - one link: collectives run one after another on it;
//   - compute: forward = model FLOPs / 3 and backward = the rest (with what a checkpoint
//     recomputes), at the stated FLOP/s; backward's time spread over the loss head and the
//     blocks in proportion to their forward FLOPs; a parameter's gradient is complete when
//     its block's backward ends (the embedding's, used first in forward, at the end).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gradscope/core/config.h"

namespace gradscope {

struct Link {
  double bytes_per_s = 0;
  double latency_s = 0;
};

// "BANDWIDTH[,LATENCY]": 25gbit, 100Mbit/s, 50GB/s (bytes), 400gbit,2us. A usage error
// naming `flag` for anything else.
Link parse_link(const std::string& flag, const std::string& text);
// "25 Gbit/s, 2 us"
std::string link_text(const Link& link);
// A FLOP/s figure: 989e12, 989T, 2.5G. A usage error naming `flag` for anything else.
double parse_flops(const std::string& flag, const std::string& text);

struct CommModePrediction {
  std::string shard;
  double bytes_per_step = 0;  // what one rank sends, by the ring algorithms' volume
  int64_t collectives = 0;
  double comm_s = 0;     // the link's time for them, one after another
  double exposed_s = 0;  // of it, what the step waits for
  double hidden_s = 0;   // comm_s - exposed_s: what ran while backward computed
  double step_s = 0;     // forward + backward + exposed_s
};

struct CommPrediction {
  int64_t nnodes = 1, per_node = 1;
  Link inter, intra;  // inter matters only with several nodes
  double device_flops_per_s = 0;
  double forward_s = 0, backward_s = 0;  // one rank's, per step
  std::vector<CommModePrediction> modes;  // ddp, zero1, zero2, fsdp
};

// Every shard mode the optimizer allows for `config` (its model, micro-batch, accumulation,
// bucket size) on nnodes x per_node ranks.
CommPrediction predict_comm(const RunConfig& config, int64_t nnodes, int64_t per_node,
                            const Link& inter, const Link& intra, double device_flops_per_s);
nlohmann::json comm_prediction_to_json(const CommPrediction& p);

}  // namespace gradscope
