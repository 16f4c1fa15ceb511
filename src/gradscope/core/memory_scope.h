// Who is allocating: the scope stack that labels every block of tensor storage with the
// component it belongs to, the module that made it and the phase it was made in.
//
// The stack is process-wide, not per thread: the training thread pushes and pops it, and an
// allocation made meanwhile by LibTorch's worker threads (intra-op, a collective's) is made for
// that thread's work, so it takes the same label. Labels are interned: each distinct
// (component, module, phase) gets a small id, and the CPU tracking allocator stores the id
// of the scope an allocation was made in beside the block (measure/memory.h), keeping the live
// bytes of each label. Models push their blocks and sub-layers through the block runner's seam
// (models/model.h), the loss head its logits, the sharded steps their collective buffers; the
// trainer sets the phase. Nothing pushed: module "" (shown as "unnamed"), counted like the rest.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gradscope/core/memory_timeline.h"

namespace gradscope {

// At most this many labels; later ones all share kOverflowLabel ("label table full").
constexpr uint32_t kMaxMemoryLabels = 1 << 14;
// Label 0: other, unnamed, before the run's first phase.
constexpr uint32_t kUnnamedLabel = 0;
constexpr uint32_t kOverflowLabel = 1;

// The id of (component, module, phase), made on first use.
uint32_t intern_memory_label(const TimelineLabel& label);
// The label of an id (a copy; an unknown id gives kUnnamedLabel's).
TimelineLabel memory_label(uint32_t id);
// How many ids exist (ids are 0 .. count - 1).
uint32_t memory_label_count();

// The label allocations are made under right now (a relaxed atomic read: the allocator's path).
uint32_t current_memory_label();

// Called with the new current label each time it changes (nullptr: nobody), outside the
// scope's lock: how CUDA's caching allocator gets the labels (measure/memory.h).
using MemoryLabelListener = void (*)(uint32_t label);
void set_memory_label_listener(MemoryLabelListener listener);

// Sets the phase every label is made in from now on ("data", "forward", ...).
void set_memory_phase(const std::string& phase);
std::string current_memory_phase();

// A module path and the component override in force with it (see module_of_node below).
struct ModuleOfNode {
  std::string path;
  std::optional<MemoryComponent> component;
};

// Pushes one segment of the module path ("block 3", "attention"; nested pushes are joined
// with "/") or overrides the component, until destroyed. Destroy in reverse order of making
// (they are scoped objects of one thread).
class MemoryScope {
 public:
  explicit MemoryScope(const std::string& module);
  explicit MemoryScope(MemoryComponent component);
  // The whole module path at once, replacing what is pushed until destroyed: a backward
  // node's module, found from the forward that made it.
  static MemoryScope whole_path(const ModuleOfNode& module);
  ~MemoryScope();
  MemoryScope(const MemoryScope&) = delete;
  MemoryScope& operator=(const MemoryScope&) = delete;
  MemoryScope(MemoryScope&& other) noexcept;
  MemoryScope& operator=(MemoryScope&&) = delete;

 private:
  MemoryScope() = default;
  bool active_ = false;
  bool records_range_ = false;
  uint64_t first_sequence_nr_ = 0;
};

// The module path pushed now ("" when none).
std::string current_memory_module();

// Backward's allocations are labelled by the forward that made them: a module scope records
// the autograd sequence numbers its forward used ([first, end), LibTorch gives each node of
// the graph one as it is made), and backward, running a node, pushes the module path (and the
// component override) that was in force when the node was made (measure/memory_window.h
// installs the hook). Ranges of one forward nest; the innermost wins.
std::optional<ModuleOfNode> module_of_node(uint64_t sequence_nr);
// Forgets the ranges recorded so far (a step's forwards are done with once its backward is):
// the trainer calls it as each step begins. Past kMaxModuleRanges segments all are forgotten.
void clear_module_ranges();
constexpr size_t kMaxModuleRanges = 1 << 16;

// The component an allocation in `phase` gets when nothing overrides it: activations in
// forward and backward, collective buffers in comm, other elsewhere.
MemoryComponent default_component(const std::string& phase);

}  // namespace gradscope
