#include "gradscope/measure/memory_viz.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>
#include <fmt/format.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <unordered_map>
#include <vector>

#include "gradscope/core/files.h"

namespace gradscope {
namespace memory_viz {

using Dict = c10::Dict<c10::IValue, c10::IValue>;
using List = c10::List<c10::IValue>;

Dict new_dict() { return Dict(c10::AnyType::get(), c10::AnyType::get()); }
List new_list() { return List(c10::AnyType::get()); }

// Addresses for the bytes live before the window that no block names: one made-up block per
// label, laid end to end from an address user space on x86-64 and aarch64 does not reach
// (above 2^47), below 2^63 so that it stays a positive integer in the pickle.
constexpr uint64_t kUnnamedBase = uint64_t{1} << 60;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + (shape.size() == 1 ? ",)" : ")");
}

// One frame per block: "file" the module, "name" the component and phase, and the tensor.
List frames_of(const TimelineLabel& label, const TimelineTensor* tensor) {
  Dict frame = new_dict();
  frame.insert("filename", label.module.empty() ? std::string("unnamed") : label.module);
  frame.insert("line", int64_t{0});
  std::string name = std::string(component_name(label.component));
  if (!label.phase.empty()) name += " in " + label.phase;
  if (tensor != nullptr)
    name += fmt::format(": {} {} {}", tensor->name, shape_text(tensor->shape), tensor->dtype);
  frame.insert("name", name);
  List frames = new_list();
  frames.push_back(frame);
  return frames;
}

Dict block_dict(uint64_t address, int64_t bytes, const List& frames) {
  Dict b = new_dict();
  b.insert("address", static_cast<int64_t>(address));
  b.insert("size", bytes);
  b.insert("requested_size", bytes);
  b.insert("state", std::string("active_allocated"));
  b.insert("frames", frames);
  return b;
}

Dict segment_dict(uint64_t address, int64_t bytes, const List& frames) {
  Dict seg = new_dict();
  seg.insert("device", int64_t{0});
  seg.insert("address", static_cast<int64_t>(address));
  seg.insert("total_size", bytes);
  seg.insert("allocated_size", bytes);
  seg.insert("active_size", bytes);
  seg.insert("requested_size", bytes);
  seg.insert("stream", int64_t{0});
  seg.insert("segment_type", std::string("large"));
  List blocks = new_list();
  blocks.push_back(block_dict(address, bytes, frames));
  seg.insert("blocks", blocks);
  return seg;
}

Dict trace_entry(const char* action, uint64_t address, int64_t bytes, int64_t t_ns,
                 const List& frames) {
  Dict e = new_dict();
  e.insert("action", std::string(action));
  e.insert("addr", static_cast<int64_t>(address));
  e.insert("size", bytes);
  e.insert("stream", int64_t{0});
  e.insert("time_us", t_ns / 1000);
  e.insert("frames", frames);
  return e;
}

}  // namespace memory_viz

void write_memory_viz_snapshot(const MemoryTimeline& t, const std::string& path) {
  using namespace memory_viz;
  const auto& events = t.events;
  const size_t n = events.size();
  const TimelineBlocks blocks = match_timeline_blocks(t, path);
  const std::vector<int64_t>& block_of = blocks.block_of;
  const std::vector<uint32_t>& label_of = blocks.final_label;
  // What is live when the window closes: the blocks allocated and not freed, and per label the
  // unnamed bytes from before the window that no free took.
  std::vector<bool> freed(n, false);
  std::vector<int64_t> unnamed(t.meta.labels.size(), 0);
  for (size_t i = 0; i < n; ++i) {
    const TimelineEvent& e = events[i];
    if (e.kind == TimelineEventKind::kAlloc && e.address == 0) unnamed[e.label] += e.bytes;
    if (e.kind != TimelineEventKind::kFree) continue;
    if (block_of[i] >= 0)
      freed[static_cast<size_t>(block_of[i])] = true;
    else
      unnamed[e.label] -= e.bytes;
  }
  std::unordered_map<int64_t, const TimelineTensor*> tensor_of;
  for (const TimelineTensor& tensor : t.meta.tensors) tensor_of[tensor.event] = &tensor;
  const auto frames_for = [&](int64_t block, uint32_t label) {
    const auto found = block >= 0 ? tensor_of.find(block) : tensor_of.end();
    return frames_of(t.meta.labels.at(label),
                     found == tensor_of.end() ? nullptr : found->second);
  };

  List segments = new_list();
  for (size_t i = 0; i < n; ++i) {
    const TimelineEvent& e = events[i];
    if (e.kind == TimelineEventKind::kAlloc && e.address != 0 && !freed[i])
      segments.push_back(segment_dict(e.address, e.bytes,
                                      frames_for(static_cast<int64_t>(i), label_of[i])));
  }
  uint64_t made_up = kUnnamedBase;
  for (size_t label = 0; label < unnamed.size(); ++label) {
    if (unnamed[label] <= 0) continue;
    segments.push_back(segment_dict(made_up, unnamed[label],
                                    frames_for(-1, static_cast<uint32_t>(label))));
    made_up += (static_cast<uint64_t>(unnamed[label]) + 4095) / 4096 * 4096;
  }

  // The window's own allocations and frees (what was live before it is the starting state),
  // the last kMemoryVizMaxEvents of them.
  const size_t opened =
      t.meta.phases.empty() ? 0 : static_cast<size_t>(t.meta.phases.front().first_event);
  std::vector<size_t> kept;
  for (size_t i = opened; i < n; ++i)
    if (events[i].kind != TimelineEventKind::kRelabel && events[i].address != 0) kept.push_back(i);
  const auto most = static_cast<size_t>(kMemoryVizMaxEvents);
  const size_t from = kept.size() > most ? kept.size() - most : 0;
  List trace = new_list();
  for (size_t k = from; k < kept.size(); ++k) {
    const TimelineEvent& e = events[kept[k]];
    const int64_t block = block_of[kept[k]];
    const List frames = frames_for(block, block >= 0 ? label_of[block] : e.label);
    if (e.kind == TimelineEventKind::kAlloc) {
      trace.push_back(trace_entry("alloc", e.address, e.bytes, e.t_ns, frames));
    } else {
      trace.push_back(trace_entry("free_requested", e.address, e.bytes, e.t_ns, frames));
      trace.push_back(trace_entry("free_completed", e.address, e.bytes, e.t_ns, frames));
    }
  }
  List traces = new_list();
  traces.push_back(trace);
  Dict snapshot = new_dict();
  snapshot.insert("segments", segments);
  snapshot.insert("device_traces", traces);
  const std::vector<char> bytes = torch::jit::pickle(c10::IValue(snapshot));
  write_file_atomically(path, std::string(bytes.begin(), bytes.end()));
}

}  // namespace gradscope
