// A memory timeline made by hand for tests: its file laid out byte by byte as
// core/memory_timeline.h describes it (so that a test can also lay out a broken one), and a
// small window whose replay is known: a parameter and unnamed bytes live before the window,
// an activation freed in backward, a block relabelled as a gradient, optimizer state that
// makes the peak, and a free taken from the unnamed bytes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gradscope/core/memory_timeline.h"

namespace gradscope::testing {

// `v` as its little-endian bytes.
template <typename T>
std::string timeline_le(T v) {
  std::string out(sizeof(T), '\0');
  std::memcpy(out.data(), &v, sizeof(T));
  return out;
}

// The events as chunks of at most `chunk` events each: "EVTS", n, then each column in turn.
inline std::string timeline_chunks(const std::vector<TimelineEvent>& events, size_t chunk) {
  std::string out;
  for (size_t from = 0; from < events.size(); from += chunk) {
    const size_t n = std::min(chunk, events.size() - from);
    out += "EVTS" + timeline_le(static_cast<uint32_t>(n));
    for (size_t i = from; i < from + n; ++i) out += static_cast<char>(events[i].kind);
    for (size_t i = from; i < from + n; ++i) out += timeline_le(events[i].label);
    for (size_t i = from; i < from + n; ++i) out += timeline_le(events[i].address);
    for (size_t i = from; i < from + n; ++i) out += timeline_le(events[i].bytes);
    for (size_t i = from; i < from + n; ++i) out += timeline_le(events[i].live);
    for (size_t i = from; i < from + n; ++i) out += timeline_le(events[i].t_ns);
  }
  return out;
}

// A whole file: magic, the chunks, the JSON part `meta_json`, the trailer.
inline std::string timeline_file(const std::vector<TimelineEvent>& events,
                                 const std::string& meta_json, size_t chunk = 4) {
  std::string out = "GSMEMTL1" + timeline_chunks(events, chunk);
  const uint64_t meta_at = out.size();
  out += "META" + timeline_le(static_cast<uint64_t>(meta_json.size())) + meta_json;
  return out + timeline_le(meta_at) + "GSMEMEND";
}

inline TimelineEvent timeline_event(TimelineEventKind kind, uint32_t label, uint64_t address,
                                    int64_t bytes, int64_t live, int64_t t_ns) {
  TimelineEvent e;
  e.kind = kind;
  e.label = label;
  e.address = address;
  e.bytes = bytes;
  e.live = live;
  e.t_ns = t_ns;
  return e;
}

// The sample window. Its replay: peak 15000 bytes after event 6 (optimizer state 8000,
// the parameter 4000, the gradient 2000, unnamed 1000); the block at 0x3000 is a gradient
// from its allocation on.
inline MemoryTimeline sample_timeline(const std::string& run_id = "sample-run") {
  using K = TimelineEventKind;
  MemoryTimeline t;
  TimelineMeta& m = t.meta;
  m.run_id = run_id;
  m.device = "cpu";
  m.first_step = 1;
  m.last_step = 1;
  m.labels = {{MemoryComponent::kParameters, "embedding", "before the window"},
              {MemoryComponent::kOther, "", "before the window"},
              {MemoryComponent::kActivations, "block 0 attention", "forward"},
              {MemoryComponent::kGradients, "embedding", "backward"},
              {MemoryComponent::kOptimizerState, "optimizer step", "optimizer"}};
  t.events = {timeline_event(K::kAlloc, 0, 0x1000, 4000, 4000, 0),
              timeline_event(K::kAlloc, 1, 0, 1000, 5000, 0),
              timeline_event(K::kAlloc, 2, 0x2000, 3000, 8000, 10),
              timeline_event(K::kAlloc, 2, 0x3000, 2000, 10000, 20),
              timeline_event(K::kFree, 2, 0x2000, 3000, 7000, 30),
              timeline_event(K::kRelabel, 3, 0x3000, 2000, 7000, 40),
              timeline_event(K::kAlloc, 4, 0x4000, 8000, 15000, 50),
              timeline_event(K::kFree, 1, 0x5000, 500, 14500, 60),
              timeline_event(K::kFree, 4, 0x4000, 8000, 6500, 70)};
  m.phases = {{1, "forward", 2, 4}, {1, "backward", 4, 6}, {1, "optimizer", 6, 9}};
  m.tensors = {{0, "embedding.weight", {10, 100}, "float32"},
               {6, "exp_avg", {2000}, "float32"}};
  m.events = static_cast<int64_t>(t.events.size());
  m.cap_bytes = 1 << 20;
  m.window_peak_bytes = 15000;
  m.estimate = {{"parameters", 4000}, {"gradients", 4000}, {"optimizer state", 8000},
                {"activations", 3000}};
  m.estimate_peak_phase = "optimizer";
  m.estimate_peak_bytes = 19000;
  return t;
}

inline std::string sample_timeline_file(const std::string& run_id = "sample-run") {
  const MemoryTimeline t = sample_timeline(run_id);
  return timeline_file(t.events, timeline_meta_to_json(t.meta));
}

}  // namespace gradscope::testing
