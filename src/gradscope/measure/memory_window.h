// Recording a memory timeline (core/memory_timeline.h) on the CPU, and the labels of what
// backward allocates.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "gradscope/core/memory_timeline.h"
#include "gradscope/measure/memory.h"

namespace gradscope {

// Installs, once per process, the hook that labels backward's allocations with the module
// whose forward made the node running (core/memory_scope.h, module_of_node). It costs one
// lookup per backward node.
void install_backward_memory_labels();

// One window of a memory timeline: observes the CPU tracking allocator from open() to
// close() and streams what it sees to a timeline file.
class MemoryWindowRecorder final : public CpuMemoryTracker::Observer {
 public:
  // Nothing is recorded before open(); the file is written under a temporary name until
  // close() renames it into place. cap_bytes: the file's size cap (core/memory_timeline.h).
  MemoryWindowRecorder(const std::string& path, int64_t cap_bytes);
  ~MemoryWindowRecorder() override;
  MemoryWindowRecorder(const MemoryWindowRecorder&) = delete;
  MemoryWindowRecorder& operator=(const MemoryWindowRecorder&) = delete;

  // Opens the window between steps: the tracker's window peak starts at its live bytes, what
  // is live is written first (the `named` tensors by name, shape and dtype: parameters,
  // gradients, optimizer state; the rest by label), and from then on every allocation, free
  // and relabel, with the operation that made each new block's tensor where LibTorch says.
  void open(const std::vector<std::pair<std::string, at::Tensor>>& named);
  bool is_open() const { return open_; }
  // A phase of a step begins (the previous one ends).
  void phase(int64_t step, const std::string& phase);
  // Closes the window and writes the file: `meta`'s run, device, steps and estimate as given,
  // the labels, phases, tensors and the tracker's window peak filled in here.
  void close(TimelineMeta meta);

  void on_event(TimelineEventKind kind, uint64_t address, int64_t bytes, uint32_t label,
                int64_t live, uint32_t previous) override;
  // The operation `name` produced `t`: names the block of t's storage if it was allocated in
  // the window and nothing named it yet.
  void describe(const at::Tensor& t, const char* name);

 private:
  struct State;
  std::unique_ptr<State> state_;
  bool open_ = false;
};

}  // namespace gradscope
