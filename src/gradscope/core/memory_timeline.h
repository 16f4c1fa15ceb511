// A memory timeline: every allocation and free of tensor storage during the steps a run was
// asked to watch (`run --memory-timeline`), each labelled with the component it belongs to,
// the module that made it and the phase it was made in (docs/memory-timeline.md).
//
// The file is columnar and written as the steps run, so a long window never sits in memory:
//   "GSMEMTL1"                                   8 bytes, the magic
//   chunk*:  "EVTS", u32 n (1 .. kTimelineChunkEvents), then n values of each column in turn:
//            kind u8, label u32, address u64, bytes i64, live i64, t_ns i64
//   "META", u64 m (at most kTimelineMaxMetaBytes), m bytes of JSON (TimelineMeta)
//   u64 offset of "META" from the file's start, "GSMEMEND"
// All integers little-endian. A file without its trailer was cut short (the run was killed):
// the reader refuses it, naming the file.
//
// A timeline file is outside input when `report` reads it back: every count, index and size is
// checked against the file and against the limits below before anything is allocated, and
// every failure is a usage error naming the file (docs/input-safety.md).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace gradscope {

// What a block of tensor storage is for. The order is the order the report stacks them in.
enum class MemoryComponent : uint8_t {
  kParameters = 0,
  kGradients,
  kOptimizerState,
  kActivations,
  kLogits,  // what a language model's loss head allocates (its logits and their softmax)
  kCollectiveBuffers,
  kOther,
  kCount
};
// "parameters", "gradients", "optimizer state", "activations", "logits",
// "collective buffers", "other".
const char* component_name(MemoryComponent c);
std::optional<MemoryComponent> parse_component(const std::string& name);

// Who made an allocation: its component, the module ("layers.3/attention", "loss head",
// "recompute/layers.3", a parameter's name, "optimizer state"; "" where nothing was pushed:
// shown as "unnamed") and the phase ("data", "forward", "backward", "optimizer", "comm",
// "between steps", "evaluation", "before the first step"; "" for a label found by identity).
struct TimelineLabel {
  MemoryComponent component = MemoryComponent::kOther;
  std::string module;
  std::string phase;
};

enum class TimelineEventKind : uint8_t {
  // A block allocated (in the window), or, at t = 0, live before it: `address` a real block
  // (a parameter, a gradient, an optimizer state tensor, named in tensors) or 0 for the bytes
  // live before the window that nothing names, one event per label.
  kAlloc = 0,
  kFree = 1,
  // The block at `address` is, for its whole life, of `label` (a gradient found to be one
  // when backward ends, a tensor found to be optimizer state): `bytes` its size.
  kRelabel = 2,
  kCount
};

// One event. `live` is the tracking allocator's live bytes right after it, read under the
// same lock as the change, so it is the running total the timeline must reproduce.
struct TimelineEvent {
  TimelineEventKind kind = TimelineEventKind::kAlloc;
  uint32_t label = 0;    // index into TimelineMeta::labels
  uint64_t address = 0;  // the block's address; 0: the unnamed bytes live before the window
  int64_t bytes = 0;     // > 0
  int64_t live = 0;
  int64_t t_ns = 0;  // since the window opened
};

// What a block held, where gradscope knows it: a parameter or optimizer state by name, or the
// output of the operation that first wrote a block allocated in the window.
struct TimelineTensor {
  int64_t event = 0;  // the index of the block's kAlloc event
  std::string name;   // "layers.3.attention.wq.weight", "aten::mm", ...
  std::vector<int64_t> shape;
  std::string dtype;  // "float32", "bfloat16", ...
};

// The phases of the window: events [first_event, end_event) happened in `phase` of `step`.
struct TimelinePhase {
  int64_t step = 0;  // 1-based, warm-up included
  std::string phase;
  int64_t first_event = 0, end_event = 0;
};

// The file's JSON part.
struct TimelineMeta {
  std::string schema = "gradscope.memory-timeline/1";
  std::string run_id;
  std::string device;  // "cpu", "cuda:0"
  int64_t first_step = 0, last_step = 0;  // the window, 1-based, inclusive
  std::vector<TimelineLabel> labels;
  std::vector<TimelinePhase> phases;
  std::vector<TimelineTensor> tensors;
  int64_t events = 0;         // written
  int64_t dropped_events = 0;  // after the size cap was reached
  int64_t cap_bytes = 0;       // the file's size cap
  bool cap_reached = false;
  // The tracker's own peak over the window (a second peak register, reset when the window
  // opens), to check the timeline against: the largest `live` must equal it unless the cap
  // was reached.
  int64_t window_peak_bytes = 0;
  // The estimate's breakdown at its predicted peak (component name -> bytes) and that peak's
  // phase; empty when the run's combination has no estimate.
  std::map<std::string, int64_t> estimate;
  std::string estimate_peak_phase;
  int64_t estimate_peak_bytes = 0;
};

struct MemoryTimeline {
  TimelineMeta meta;
  std::vector<TimelineEvent> events;
};

// The JSON part both ways; its keys are TimelineMeta's member names, labels as
// {"component": component_name, "module", "phase"}, phases and tensors as objects of their
// members, estimate as {component name: bytes}. from_json checks every type, count and value
// (usage error naming `what`).
std::string timeline_meta_to_json(const TimelineMeta& meta);
TimelineMeta timeline_meta_from_json(const std::string& json, const std::string& what);

// Limits a file read back must keep; each is far above what a run writes by default.
constexpr uint32_t kTimelineChunkEvents = 65536;
constexpr uint64_t kTimelineMaxMetaBytes = uint64_t{256} << 20;
constexpr int64_t kTimelineMaxEvents = int64_t{1} << 26;
constexpr size_t kTimelineMaxLabels = 1 << 16;
constexpr size_t kTimelineMaxTensors = 1 << 20;
constexpr size_t kTimelineMaxRank = 16;  // a tensor's dimensions

// Streams a timeline to a file: events in chunks as they come, the JSON part and the trailer
// at finish(). Once the file would pass cap_bytes, further events are counted as dropped, not
// written (finish() still writes the JSON and the trailer, saying so). The file is written
// under a temporary name and renamed into place by finish(), so a killed run leaves no file
// that looks whole.
class TimelineWriter {
 public:
  TimelineWriter(std::string path, int64_t cap_bytes);
  ~TimelineWriter();
  TimelineWriter(const TimelineWriter&) = delete;
  TimelineWriter& operator=(const TimelineWriter&) = delete;

  void add(const TimelineEvent& e);
  int64_t written() const;
  int64_t dropped() const;
  // Writes the rest (meta's events, dropped_events, cap_bytes and cap_reached are set here).
  void finish(TimelineMeta meta);

 private:
  struct Impl;
  Impl* impl_;
};

// Reads a timeline file back, checked (above). Usage error naming the file on anything amiss.
MemoryTimeline read_memory_timeline(const std::string& path);
// The same from bytes already in memory (`what` names them in errors): for tests and fuzzing.
MemoryTimeline parse_memory_timeline(const std::string& bytes, const std::string& what);

// Which block each event is about: the index of the block's allocation event, or -1 for the
// bytes live before the window that nothing names (counted per label); and each block's final
// label (at its allocation's index), relabels applied. A usage error (naming `what`) when the
// events contradict each other, as replay_memory_timeline's.
struct TimelineBlocks {
  std::vector<int64_t> block_of;
  std::vector<uint32_t> final_label;
};
TimelineBlocks match_timeline_blocks(const MemoryTimeline& t, const std::string& what);

// What a timeline says once its events are replayed: each block's final label (relabels
// applied to the block's whole life), the live bytes per component after each event, the
// largest live total and the event it came after, and the blocks live then.
struct TimelineReplay {
  // [event][component] live bytes after the event (components as MemoryComponent's order).
  std::vector<std::array<int64_t, static_cast<size_t>(MemoryComponent::kCount)>> by_component;
  std::vector<int64_t> live;  // after each event: the sum of by_component
  int64_t peak_bytes = 0;
  int64_t peak_event = -1;
  struct LiveBlock {
    int64_t alloc_event = -1;  // -1: bytes live before the window that nothing names
    uint64_t address = 0;
    int64_t bytes = 0;
    uint32_t label = 0;  // its final label
  };
  std::vector<LiveBlock> live_at_peak;  // largest first
};
// Replays the events; a usage error (naming `what`) when they contradict each other: a free
// of a block never allocated and beyond the unnamed bytes of its label, a relabel of a block
// not live, a running total that differs from an event's `live`.
TimelineReplay replay_memory_timeline(const MemoryTimeline& t, const std::string& what);

}  // namespace gradscope
