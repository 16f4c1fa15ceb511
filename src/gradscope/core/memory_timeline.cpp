// Reading a memory timeline back (memory_timeline.h): its JSON part both ways, the file checked
// before anything it claims is allocated, and the replay of its events. The writer is in
// memory_timeline_writer.cpp.
#include "gradscope/core/memory_timeline.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <limits>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gradscope/core/error.h"
#include "gradscope/core/files.h"
#include "gradscope/core/json_input.h"

// The file's integers are little-endian and are read as they lie.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "a memory timeline is little-endian: a big-endian host would need byte swaps");

namespace gradscope {
namespace timeline_read {
namespace {

using json = nlohmann::json;

constexpr char kMagic[] = "GSMEMTL1";
constexpr char kEndMagic[] = "GSMEMEND";
constexpr char kChunkTag[] = "EVTS";
constexpr char kMetaTag[] = "META";
constexpr uint64_t kMagicBytes = 8;
constexpr uint64_t kTagBytes = 4;
// One event in the file: kind u8, label u32, address u64, bytes, live, t_ns i64.
constexpr uint64_t kEventBytes = 1 + 4 + 8 + 8 + 8 + 8;
constexpr uint64_t kChunkHeadBytes = kTagBytes + 4;
constexpr uint64_t kMetaHeadBytes = kTagBytes + 8;
constexpr uint64_t kTrailerBytes = 8 + 8;
constexpr char kHint[] =
    "pass a whole file written by `gradscope run --memory-timeline` (docs/memory-timeline.md)";

// Indexed by MemoryComponent.
constexpr const char* kComponentNames[] = {"parameters",  "gradients", "optimizer state",
                                           "activations", "logits",    "collective buffers",
                                           "other"};
static_assert(std::size(kComponentNames) == static_cast<size_t>(MemoryComponent::kCount));

[[noreturn]] void refuse(const std::string& what, const std::string& problem) {
  fail_usage(fmt::format("memory timeline {}: {}", what, problem), kHint);
}

// Where the bytes of a timeline come from: a string in memory or a file read with pread, so
// that a file is never held whole beside the events read from it.
struct Source {
  uint64_t size = 0;
  std::function<void(uint64_t offset, uint64_t n, char* out)> read;
};

uint64_t u64_at(const Source& s, uint64_t offset) {
  uint64_t v = 0;
  s.read(offset, 8, reinterpret_cast<char*>(&v));
  return v;
}

std::string bytes_at(const Source& s, uint64_t offset, uint64_t n) {
  std::string out(n, '\0');
  s.read(offset, n, out.data());
  return out;
}

// ---- the JSON part ----

const json& member(const json& o, const char* key, const std::string& what) {
  const auto it = o.find(key);
  if (it == o.end()) refuse(what, fmt::format("its JSON part has no \"{}\"", key));
  return *it;
}

void only_keys(const json& o, std::initializer_list<const char*> keys, const std::string& where,
               const std::string& what) {
  for (const auto& item : o.items())
    if (std::find_if(keys.begin(), keys.end(), [&](const char* k) { return item.key() == k; }) ==
        keys.end())
      refuse(what, fmt::format("{} has an unknown key \"{}\"", where,
                               item.key().substr(0, 100)));
}

int64_t integer(const json& v, const std::string& where, const std::string& what,
                int64_t lo = 0) {
  int64_t out = 0;
  if (v.is_number_unsigned() &&
      v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    out = static_cast<int64_t>(v.get<uint64_t>());
  else if (v.is_number_integer() && !v.is_number_unsigned())
    out = v.get<int64_t>();
  else
    refuse(what, fmt::format("{} is {}, not an integer", where, json_preview(v)));
  if (out < lo) refuse(what, fmt::format("{} is {}, below {}", where, out, lo));
  return out;
}

std::string text(const json& v, const std::string& where, const std::string& what) {
  if (!v.is_string()) refuse(what, fmt::format("{} is {}, not a string", where, json_preview(v)));
  return v.get<std::string>();
}

const json& array_of(const json& v, const std::string& where, size_t max,
                     const std::string& what) {
  if (!v.is_array()) refuse(what, fmt::format("{} is {}, not an array", where, json_preview(v)));
  if (v.size() > max)
    refuse(what, fmt::format("{} holds {} entries, more than the {} allowed", where, v.size(),
                             max));
  return v;
}

const json& object_of(const json& v, const std::string& where, const std::string& what) {
  if (!v.is_object())
    refuse(what, fmt::format("{} is {}, not an object", where, json_preview(v)));
  return v;
}

TimelineLabel label_from(const json& v, size_t i, const std::string& what) {
  const std::string where = fmt::format("labels[{}]", i);
  object_of(v, where, what);
  only_keys(v, {"component", "module", "phase"}, where, what);
  TimelineLabel l;
  const std::string c = text(member(v, "component", what), where + ".component", what);
  const auto component = parse_component(c);
  if (!component)
    refuse(what, fmt::format("{}.component \"{}\" is no component", where, c.substr(0, 60)));
  l.component = *component;
  l.module = text(member(v, "module", what), where + ".module", what);
  l.phase = text(member(v, "phase", what), where + ".phase", what);
  return l;
}

TimelinePhase phase_from(const json& v, size_t i, const std::string& what) {
  const std::string where = fmt::format("phases[{}]", i);
  object_of(v, where, what);
  only_keys(v, {"step", "phase", "first_event", "end_event"}, where, what);
  TimelinePhase p;
  p.step = integer(member(v, "step", what), where + ".step", what, 1);
  p.phase = text(member(v, "phase", what), where + ".phase", what);
  p.first_event = integer(member(v, "first_event", what), where + ".first_event", what);
  p.end_event = integer(member(v, "end_event", what), where + ".end_event", what);
  return p;
}

TimelineTensor tensor_from(const json& v, size_t i, const std::string& what) {
  const std::string where = fmt::format("tensors[{}]", i);
  object_of(v, where, what);
  only_keys(v, {"event", "name", "shape", "dtype"}, where, what);
  TimelineTensor t;
  t.event = integer(member(v, "event", what), where + ".event", what);
  t.name = text(member(v, "name", what), where + ".name", what);
  const json& shape = array_of(member(v, "shape", what), where + ".shape", kTimelineMaxRank, what);
  for (size_t d = 0; d < shape.size(); ++d)
    t.shape.push_back(integer(shape[d], fmt::format("{}.shape[{}]", where, d), what));
  t.dtype = text(member(v, "dtype", what), where + ".dtype", what);
  return t;
}

// The members whose value is one integer, in the order of TimelineMeta.
struct IntegerMember {
  const char* key;
  int64_t TimelineMeta::*field;
};
constexpr IntegerMember kIntegerMembers[] = {
    {"first_step", &TimelineMeta::first_step},
    {"last_step", &TimelineMeta::last_step},
    {"events", &TimelineMeta::events},
    {"dropped_events", &TimelineMeta::dropped_events},
    {"cap_bytes", &TimelineMeta::cap_bytes},
    {"window_peak_bytes", &TimelineMeta::window_peak_bytes},
    {"estimate_peak_bytes", &TimelineMeta::estimate_peak_bytes},
};

// The checks that need more than one member: the window's steps, the phases within the events
// and in order, each tensor naming an event.
void check_meta(const TimelineMeta& m, const std::string& what) {
  if (m.schema != "gradscope.memory-timeline/1")
    refuse(what, fmt::format("schema \"{}\" is not gradscope.memory-timeline/1",
                             m.schema.substr(0, 60)));
  if (m.last_step < m.first_step)
    refuse(what, fmt::format("the window's last step {} is before its first {}", m.last_step,
                             m.first_step));
  if (m.events > kTimelineMaxEvents)
    refuse(what, fmt::format("it says it holds {} events, more than the {} allowed", m.events,
                             kTimelineMaxEvents));
  int64_t end = 0;
  for (size_t i = 0; i < m.phases.size(); ++i) {
    const TimelinePhase& p = m.phases[i];
    if (p.first_event < end || p.end_event < p.first_event || p.end_event > m.events)
      refuse(what, fmt::format("phases[{}] covers events [{}, {}), not within the {} events "
                               "and after the phase before it (which ends at {})",
                               i, p.first_event, p.end_event, m.events, end));
    end = p.end_event;
  }
  for (size_t i = 0; i < m.tensors.size(); ++i)
    if (m.tensors[i].event >= m.events)
      refuse(what, fmt::format("tensors[{}] names event {}, past the {} events", i,
                               m.tensors[i].event, m.events));
}

}  // namespace
}  // namespace timeline_read

const char* component_name(MemoryComponent c) {
  const auto i = static_cast<size_t>(c);
  return i < std::size(timeline_read::kComponentNames) ? timeline_read::kComponentNames[i]
                                                       : "other";
}

std::optional<MemoryComponent> parse_component(const std::string& name) {
  using timeline_read::kComponentNames;
  for (size_t i = 0; i < std::size(kComponentNames); ++i)
    if (name == kComponentNames[i]) return static_cast<MemoryComponent>(i);
  return std::nullopt;
}

std::string timeline_meta_to_json(const TimelineMeta& meta) {
  using json = nlohmann::json;
  json j = json::object();
  j["schema"] = meta.schema;
  j["run_id"] = meta.run_id;
  j["device"] = meta.device;
  for (const auto& m : timeline_read::kIntegerMembers) j[m.key] = meta.*m.field;
  j["cap_reached"] = meta.cap_reached;
  j["labels"] = json::array();
  for (const TimelineLabel& l : meta.labels)
    j["labels"].push_back(
        {{"component", component_name(l.component)}, {"module", l.module}, {"phase", l.phase}});
  j["phases"] = json::array();
  for (const TimelinePhase& p : meta.phases)
    j["phases"].push_back({{"step", p.step},
                           {"phase", p.phase},
                           {"first_event", p.first_event},
                           {"end_event", p.end_event}});
  j["tensors"] = json::array();
  for (const TimelineTensor& t : meta.tensors)
    j["tensors"].push_back(
        {{"event", t.event}, {"name", t.name}, {"shape", t.shape}, {"dtype", t.dtype}});
  j["estimate"] = json::object();
  for (const auto& [component, bytes] : meta.estimate) j["estimate"][component] = bytes;
  j["estimate_peak_phase"] = meta.estimate_peak_phase;
  // Names come from modules and files: invalid UTF-8 is replaced rather than thrown on.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

TimelineMeta timeline_meta_from_json(const std::string& text, const std::string& what) {
  using namespace timeline_read;
  const json j = parse_json_input_unique(text, fmt::format("memory timeline {}", what), kHint);
  object_of(j, "its JSON part", what);
  only_keys(j,
            {"schema", "run_id", "device", "first_step", "last_step", "events", "dropped_events",
             "cap_bytes", "window_peak_bytes", "estimate_peak_bytes", "cap_reached", "labels",
             "phases", "tensors", "estimate", "estimate_peak_phase"},
            "its JSON part", what);
  TimelineMeta m;
  m.schema = timeline_read::text(member(j, "schema", what), "schema", what);
  m.run_id = timeline_read::text(member(j, "run_id", what), "run_id", what);
  m.device = timeline_read::text(member(j, "device", what), "device", what);
  for (const auto& im : kIntegerMembers)
    m.*im.field = integer(member(j, im.key, what), im.key, what);
  const json& cap_reached = member(j, "cap_reached", what);
  if (!cap_reached.is_boolean())
    refuse(what, fmt::format("cap_reached is {}, not true or false", json_preview(cap_reached)));
  m.cap_reached = cap_reached.get<bool>();
  const json& labels = array_of(member(j, "labels", what), "labels", kTimelineMaxLabels, what);
  for (size_t i = 0; i < labels.size(); ++i) m.labels.push_back(label_from(labels[i], i, what));
  const json& phases = array_of(member(j, "phases", what), "phases",
                                static_cast<size_t>(kTimelineMaxEvents), what);
  for (size_t i = 0; i < phases.size(); ++i) m.phases.push_back(phase_from(phases[i], i, what));
  const json& tensors = array_of(member(j, "tensors", what), "tensors", kTimelineMaxTensors, what);
  for (size_t i = 0; i < tensors.size(); ++i) m.tensors.push_back(tensor_from(tensors[i], i, what));
  const json& estimate = object_of(member(j, "estimate", what), "estimate", what);
  for (const auto& item : estimate.items()) {
    if (!parse_component(item.key()))
      refuse(what, fmt::format("estimate names \"{}\", which is no component",
                               item.key().substr(0, 60)));
    m.estimate[item.key()] = integer(item.value(), "estimate." + item.key(), what);
  }
  m.estimate_peak_phase =
      timeline_read::text(member(j, "estimate_peak_phase", what), "estimate_peak_phase", what);
  check_meta(m, what);
  return m;
}

namespace timeline_read {
namespace {

// The trailer, then the JSON part it points at: returns the offset of "META" (where the events
// end) and fills `meta`.
uint64_t read_meta(const Source& s, const std::string& what, TimelineMeta* meta) {
  if (s.size < kMagicBytes || bytes_at(s, 0, kMagicBytes) != kMagic)
    refuse(what, "it does not start with GSMEMTL1, so it is no memory timeline");
  if (s.size < kMagicBytes + kMetaHeadBytes + kTrailerBytes ||
      bytes_at(s, s.size - 8, 8) != kEndMagic)
    refuse(what, fmt::format("it was cut short ({} bytes, no GSMEMEND at its end): the run "
                             "that wrote it stopped before the window closed",
                             s.size));
  const uint64_t trailer = s.size - kTrailerBytes;
  const uint64_t at = u64_at(s, trailer);
  if (at < kMagicBytes || at > trailer - kMetaHeadBytes)
    refuse(what, fmt::format("its trailer puts the JSON part at byte {}, outside the {} bytes "
                             "between the magic and the trailer",
                             at, trailer));
  if (bytes_at(s, at, kTagBytes) != kMetaTag)
    refuse(what, fmt::format("no META at byte {}, where its trailer puts the JSON part", at));
  const uint64_t length = u64_at(s, at + kTagBytes);
  if (length > kTimelineMaxMetaBytes)
    refuse(what, fmt::format("its JSON part is {} bytes long, past the cap of {}", length,
                             kTimelineMaxMetaBytes));
  if (length != trailer - at - kMetaHeadBytes)
    refuse(what, fmt::format("its JSON part says {} bytes, but {} lie between it and the "
                             "trailer",
                             length, trailer - at - kMetaHeadBytes));
  *meta = timeline_meta_from_json(bytes_at(s, at + kMetaHeadBytes, length), what);
  return at;
}

// The events of one chunk at `at` (n of them), appended to `out` and checked.
void read_chunk(const Source& s, uint64_t at, uint32_t n, size_t labels, const std::string& what,
                std::vector<TimelineEvent>* out) {
  const std::string col = bytes_at(s, at, uint64_t{n} * kEventBytes);
  const size_t first = out->size();
  out->resize(first + n);
  const char* p = col.data();
  auto column = [&](size_t width, auto&& set) {
    for (uint32_t i = 0; i < n; ++i, p += width) set((*out)[first + i], p);
  };
  column(1, [&](TimelineEvent& e, const char* b) {
    const auto kind = static_cast<uint8_t>(*b);
    if (kind >= static_cast<uint8_t>(TimelineEventKind::kCount))
      refuse(what, fmt::format("event {} has kind {}, which is none", &e - out->data(), kind));
    e.kind = static_cast<TimelineEventKind>(kind);
  });
  column(4, [&](TimelineEvent& e, const char* b) {
    std::memcpy(&e.label, b, 4);
    if (e.label >= labels)
      refuse(what, fmt::format("event {} has label {}, past the {} labels", &e - out->data(),
                               e.label, labels));
  });
  column(8, [&](TimelineEvent& e, const char* b) { std::memcpy(&e.address, b, 8); });
  column(8, [&](TimelineEvent& e, const char* b) {
    std::memcpy(&e.bytes, b, 8);
    if (e.bytes <= 0)
      refuse(what, fmt::format("event {} has {} bytes, not a positive size", &e - out->data(),
                               e.bytes));
  });
  column(8, [&](TimelineEvent& e, const char* b) {
    std::memcpy(&e.live, b, 8);
    if (e.live < 0)
      refuse(what, fmt::format("event {} has {} live bytes", &e - out->data(), e.live));
  });
  column(8, [&](TimelineEvent& e, const char* b) {
    std::memcpy(&e.t_ns, b, 8);
    if (e.t_ns < 0)
      refuse(what, fmt::format("event {} happened at {} ns, before the window opened",
                               &e - out->data(), e.t_ns));
  });
}

MemoryTimeline parse(const Source& s, const std::string& what) {
  MemoryTimeline t;
  const uint64_t events_end = read_meta(s, what, &t.meta);
  const uint64_t room = events_end - kMagicBytes;
  const auto declared = static_cast<uint64_t>(t.meta.events);
  // Every event takes kEventBytes, every chunk of up to kTimelineChunkEvents a head besides.
  if (declared * kEventBytes > room)
    refuse(what, fmt::format("it says it holds {} events, but its {} bytes of events hold at "
                             "most {}",
                             declared, room, room / kEventBytes));
  t.events.reserve(declared);
  uint64_t at = kMagicBytes;
  while (at < events_end) {
    if (events_end - at < kChunkHeadBytes || bytes_at(s, at, kTagBytes) != kChunkTag)
      refuse(what, fmt::format("no EVTS chunk at byte {}, where the events go on", at));
    uint32_t n = 0;
    s.read(at + kTagBytes, 4, reinterpret_cast<char*>(&n));
    if (n == 0 || n > kTimelineChunkEvents)
      refuse(what, fmt::format("the chunk at byte {} says {} events, not 1 to {}", at, n,
                               kTimelineChunkEvents));
    if (t.events.size() + n > declared)
      refuse(what, fmt::format("its chunks hold more events than the {} its JSON part says",
                               declared));
    if (uint64_t{n} * kEventBytes > events_end - at - kChunkHeadBytes)
      refuse(what, fmt::format("the chunk at byte {} says {} events, past the end of the "
                               "events at byte {}",
                               at, n, events_end));
    read_chunk(s, at + kChunkHeadBytes, n, t.meta.labels.size(), what, &t.events);
    at += kChunkHeadBytes + uint64_t{n} * kEventBytes;
  }
  if (t.events.size() != declared)
    refuse(what, fmt::format("its chunks hold {} events, but its JSON part says {}",
                             t.events.size(), declared));
  for (size_t i = 0; i < t.meta.tensors.size(); ++i)
    if (t.events[t.meta.tensors[i].event].kind != TimelineEventKind::kAlloc)
      refuse(what, fmt::format("tensors[{}] names event {}, which allocates nothing", i,
                               t.meta.tensors[i].event));
  return t;
}

}  // namespace
}  // namespace timeline_read

MemoryTimeline parse_memory_timeline(const std::string& bytes, const std::string& what) {
  timeline_read::Source s;
  s.size = bytes.size();
  s.read = [&](uint64_t offset, uint64_t n, char* out) {
    std::memcpy(out, bytes.data() + offset, n);
  };
  return timeline_read::parse(s, what);
}

MemoryTimeline read_memory_timeline(const std::string& path) {
  check_input_file(path, "memory timeline");
  // Non-blocking, so that a FIFO put in the file's place since the check is refused, not
  // waited on.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    fail_usage(fmt::format("cannot read memory timeline {}: {}", path, std::strerror(errno)),
               "check the file's permissions");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    fail_usage(fmt::format("memory timeline {} is not a regular file", path));
  timeline_read::Source s;
  s.size = static_cast<uint64_t>(st.st_size);
  s.read = [&](uint64_t offset, uint64_t n, char* out) {
    while (n > 0) {
      const ssize_t got = ::pread(fd, out, n, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0)
        fail_usage(fmt::format("cannot read memory timeline {} at byte {}: {}", path, offset,
                               got < 0 ? std::strerror(errno) : "it ended early"));
      out += got;
      offset += static_cast<uint64_t>(got);
      n -= static_cast<uint64_t>(got);
    }
  };
  return timeline_read::parse(s, path);
}

namespace timeline_read {
namespace {

constexpr size_t kComponents = static_cast<size_t>(MemoryComponent::kCount);

const char* kind_name(TimelineEventKind k) {
  switch (k) {
    case TimelineEventKind::kAlloc:
      return "allocation";
    case TimelineEventKind::kFree:
      return "free";
    default:
      return "relabel";
  }
}

using Blocks = TimelineBlocks;

Blocks match_blocks(const MemoryTimeline& t, const std::string& what) {
  const size_t n = t.events.size();
  Blocks b;
  b.block_of.assign(n, -1);
  b.final_label.assign(n, 0);
  std::unordered_map<uint64_t, int64_t> live;  // address -> its block's allocation
  std::vector<int64_t> unnamed(t.meta.labels.size(), 0);
  for (size_t i = 0; i < n; ++i) {
    const TimelineEvent& e = t.events[i];
    const auto it = e.address == 0 ? live.end() : live.find(e.address);
    if (it != live.end() && e.kind != TimelineEventKind::kAlloc &&
        t.events[it->second].bytes != e.bytes)
      refuse(what, fmt::format("event {} ({}) says {} bytes at address {:#x}, but the block "
                               "there, allocated by event {}, has {}",
                               i, kind_name(e.kind), e.bytes, e.address, it->second,
                               t.events[it->second].bytes));
    if (e.kind == TimelineEventKind::kAlloc && e.address == 0) {
      if (e.t_ns != 0 || e.bytes > std::numeric_limits<int64_t>::max() - unnamed[e.label])
        refuse(what, fmt::format("event {} allocates unnamed bytes (address 0) at {} ns: only "
                                 "what was live when the window opened (at 0 ns) is unnamed",
                                 i, e.t_ns));
      unnamed[e.label] += e.bytes;
    } else if (e.kind == TimelineEventKind::kAlloc) {
      if (it != live.end())
        refuse(what, fmt::format("event {} allocates address {:#x}, which is live since event {}",
                                 i, e.address, it->second));
      live.emplace(e.address, static_cast<int64_t>(i));
      b.block_of[i] = static_cast<int64_t>(i);
      b.final_label[i] = e.label;
    } else if (e.kind == TimelineEventKind::kFree && it != live.end()) {
      b.block_of[i] = it->second;
      live.erase(it);
    } else if (e.kind == TimelineEventKind::kFree) {
      if (unnamed[e.label] < e.bytes)
        refuse(what, fmt::format("event {} frees {} bytes at address {:#x}, which was not "
                                 "allocated in the window, and its label {} has only {} bytes "
                                 "live from before the window",
                                 i, e.bytes, e.address, e.label, unnamed[e.label]));
      unnamed[e.label] -= e.bytes;
    } else {
      if (it == live.end())
        refuse(what, fmt::format("event {} relabels address {:#x}, where no block is live", i,
                                 e.address));
      b.block_of[i] = it->second;
      b.final_label[it->second] = e.label;
    }
  }
  return b;
}

// The blocks live right after event `at`, largest first (then in the order they came).
std::vector<TimelineReplay::LiveBlock> live_after(const MemoryTimeline& t, const Blocks& b,
                                                  int64_t at) {
  std::vector<char> open(t.events.size(), 0);
  std::vector<int64_t> unnamed(t.meta.labels.size(), 0);
  for (int64_t i = 0; i <= at; ++i) {
    const TimelineEvent& e = t.events[i];
    if (e.kind == TimelineEventKind::kRelabel) continue;
    const bool alloc = e.kind == TimelineEventKind::kAlloc;
    if (b.block_of[i] >= 0)
      open[b.block_of[i]] = alloc ? 1 : 0;
    else
      unnamed[e.label] += alloc ? e.bytes : -e.bytes;
  }
  std::vector<TimelineReplay::LiveBlock> out;
  for (size_t l = 0; l < unnamed.size(); ++l)
    if (unnamed[l] > 0) out.push_back({-1, 0, unnamed[l], static_cast<uint32_t>(l)});
  for (int64_t i = 0; i <= at; ++i)
    if (open[i])
      out.push_back({i, t.events[i].address, t.events[i].bytes, b.final_label[i]});
  std::stable_sort(out.begin(), out.end(), [](const auto& x, const auto& y) {
    return x.bytes > y.bytes;
  });
  return out;
}

}  // namespace
}  // namespace timeline_read

// Memory is proportional to events x components: 77 bytes per event besides the 40 of the
// event itself (the components' totals after it, the total, which block it is about and the
// block's final label, a flag while finding the peak's blocks), some 7.3 GiB with the events
// at kTimelineMaxEvents; a run's default window is far smaller.
TimelineBlocks match_timeline_blocks(const MemoryTimeline& t, const std::string& what) {
  using namespace timeline_read;
  for (size_t i = 0; i < t.events.size(); ++i)
    if (t.events[i].label >= t.meta.labels.size() || t.events[i].bytes <= 0)
      refuse(what, fmt::format("event {} names label {} of {}, or has no size", i,
                               t.events[i].label, t.meta.labels.size()));
  return match_blocks(t, what);
}

TimelineReplay replay_memory_timeline(const MemoryTimeline& t, const std::string& what) {
  using namespace timeline_read;
  const size_t n = t.events.size();
  const Blocks b = match_timeline_blocks(t, what);
  TimelineReplay r;
  r.by_component.resize(n);
  r.live.resize(n);
  std::array<int64_t, kComponents> by{};
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    const TimelineEvent& e = t.events[i];
    if (e.kind != TimelineEventKind::kRelabel) {
      const uint32_t label = b.block_of[i] >= 0 ? b.final_label[b.block_of[i]] : e.label;
      const auto c = static_cast<size_t>(t.meta.labels[label].component);
      const int64_t change = e.kind == TimelineEventKind::kAlloc ? e.bytes : -e.bytes;
      if (__builtin_add_overflow(by[c], change, &by[c]) ||
          __builtin_add_overflow(total, change, &total))
        refuse(what, fmt::format("the live bytes overflow at event {}", i));
    }
    if (total != e.live)
      refuse(what, fmt::format("event {} ({} at {} ns) says {} bytes are live, but the events "
                               "up to it add up to {}",
                               i, kind_name(e.kind), e.t_ns, e.live, total));
    r.by_component[i] = by;
    r.live[i] = total;
    if (r.peak_event < 0 || total > r.peak_bytes) {
      r.peak_bytes = total;
      r.peak_event = static_cast<int64_t>(i);
    }
  }
  if (n > 0 && !t.meta.cap_reached && r.peak_bytes != t.meta.window_peak_bytes)
    refuse(what, fmt::format("its events peak at {} live bytes (event {}), but the tracker's "
                             "own peak over the window was {}",
                             r.peak_bytes, r.peak_event, t.meta.window_peak_bytes));
  if (r.peak_event >= 0) r.live_at_peak = live_after(t, b, r.peak_event);
  return r;
}

}  // namespace gradscope
