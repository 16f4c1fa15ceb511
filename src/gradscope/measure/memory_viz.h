// A memory timeline (core/memory_timeline.h) as the snapshot PyTorch's memory_viz reads: the
// pickle torch.cuda.memory._snapshot() returns, with the CPU's blocks in it.
#pragma once

#include <string>

#include "gradscope/core/memory_timeline.h"

namespace gradscope {

// The events a snapshot keeps, the last ones, as PyTorch's history keeps its last
// max_entries: enough for a few steps of the models gradscope trains, and a file memory_viz
// opens in a browser.
constexpr int64_t kMemoryVizMaxEvents = 100000;

// Writes `t` to `path` as memory_viz's snapshot: {"segments": one per block live when the
// window closed, "device_traces": [[the window's allocations and frees, the last
// kMemoryVizMaxEvents]]}, each block's frames naming its label (module, component, phase)
// and, where the timeline knows it, the tensor (name, shape, dtype). Blocks that were live
// before the window are the snapshot's starting state, as memory_viz reconstructs it.
void write_memory_viz_snapshot(const MemoryTimeline& t, const std::string& path);

}  // namespace gradscope
