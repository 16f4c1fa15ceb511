// The record's distributed part of a run with --shard: how the ranks were spread, and every
// rank's figures, gathered on rank 0.
#pragma once

#include <cstdint>

#include "gradscope/comm/comm.h"
#include "gradscope/core/record.h"
#include "gradscope/strategy/shard.h"
#include "gradscope/train/session.h"

namespace gradscope {

// Sets record.distributed: the world, the shard mode, the hosts and the link; this rank's
// figures (timed_comm: what the collectives of its timed_run timed steps did) and, when every
// rank ended together, the others' (a collective every rank makes); the run is disturbed
// when any rank was.
void record_distributed_part(RunRecord& record, const Session& session, const ShardFigures& shard,
                             const CommStats& timed_comm, int64_t timed_run);

}  // namespace gradscope
