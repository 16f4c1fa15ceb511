// TimelineWriter: a memory timeline streamed to its file in chunks of columns
// (core/memory_timeline.h has the layout).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <unistd.h>

#include "gradscope/core/error.h"
#include "gradscope/core/memory_timeline.h"

namespace gradscope {
namespace timeline_write {

// Bytes one event takes in a chunk: kind u8, label u32, address u64, bytes, live, t_ns i64.
constexpr int64_t kEventBytes = 1 + 4 + 8 + 8 + 8 + 8;
constexpr int64_t kChunkHeaderBytes = 8;
// Kept free under the cap for the JSON part and the trailer of a typical run.
constexpr int64_t kTailReserve = 1 << 20;

template <typename T>
void put(std::string& out, T value) {
  // Little-endian on the machines gradscope builds for (x86-64, aarch64).
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

}  // namespace timeline_write

struct TimelineWriter::Impl {
  std::string path, temp_path;
  std::FILE* file = nullptr;
  int64_t cap_bytes = 0;
  int64_t file_bytes = 0;
  int64_t written = 0, dropped = 0;
  std::vector<TimelineEvent> pending;

  void write(const std::string& bytes) {
    if (bytes.empty()) return;
    if (std::fwrite(bytes.data(), 1, bytes.size(), file) != bytes.size())
      fail_runtime("cannot write the memory timeline " + temp_path, "check the disk has room");
    file_bytes += static_cast<int64_t>(bytes.size());
  }

  void flush_chunk() {
    using timeline_write::put;
    if (pending.empty()) return;
    std::string out;
    out.reserve(timeline_write::kChunkHeaderBytes +
                pending.size() * static_cast<size_t>(timeline_write::kEventBytes));
    out.append("EVTS", 4);
    put<uint32_t>(out, static_cast<uint32_t>(pending.size()));
    for (const auto& e : pending) put<uint8_t>(out, static_cast<uint8_t>(e.kind));
    for (const auto& e : pending) put<uint32_t>(out, e.label);
    for (const auto& e : pending) put<uint64_t>(out, e.address);
    for (const auto& e : pending) put<int64_t>(out, e.bytes);
    for (const auto& e : pending) put<int64_t>(out, e.live);
    for (const auto& e : pending) put<int64_t>(out, e.t_ns);
    write(out);
    pending.clear();
  }
};

TimelineWriter::TimelineWriter(std::string path, int64_t cap_bytes) : impl_(new Impl) {
  impl_->path = std::move(path);
  impl_->temp_path = impl_->path + ".partial";
  impl_->cap_bytes = cap_bytes;
  impl_->file = std::fopen(impl_->temp_path.c_str(), "wb");
  if (impl_->file == nullptr) {
    const std::string path_copy = impl_->path;
    delete impl_;
    fail_usage("cannot write the memory timeline " + path_copy,
               "check the folder exists and is writable");
  }
  impl_->write("GSMEMTL1");
}

TimelineWriter::~TimelineWriter() {
  if (impl_->file != nullptr) {  // never finished: leave nothing that looks whole
    std::fclose(impl_->file);
    std::remove(impl_->temp_path.c_str());
  }
  delete impl_;
}

void TimelineWriter::add(const TimelineEvent& e) {
  Impl& w = *impl_;
  const int64_t after = w.file_bytes + timeline_write::kChunkHeaderBytes +
                        (static_cast<int64_t>(w.pending.size()) + 1) * timeline_write::kEventBytes +
                        timeline_write::kTailReserve;
  if (w.dropped > 0 || (w.cap_bytes > 0 && after > w.cap_bytes)) {
    ++w.dropped;
    return;
  }
  w.pending.push_back(e);
  ++w.written;
  if (w.pending.size() == kTimelineChunkEvents) w.flush_chunk();
}

int64_t TimelineWriter::written() const { return impl_->written; }
int64_t TimelineWriter::dropped() const { return impl_->dropped; }

void TimelineWriter::finish(TimelineMeta meta) {
  using timeline_write::put;
  Impl& w = *impl_;
  w.flush_chunk();
  meta.events = w.written;
  meta.dropped_events = w.dropped;
  meta.cap_bytes = w.cap_bytes;
  meta.cap_reached = w.dropped > 0;
  const std::string json = timeline_meta_to_json(meta);
  const int64_t meta_offset = w.file_bytes;
  std::string tail = "META";
  put<uint64_t>(tail, json.size());
  tail += json;
  put<uint64_t>(tail, static_cast<uint64_t>(meta_offset));
  tail += "GSMEMEND";
  w.write(tail);
  const bool flushed = std::fflush(w.file) == 0 && fsync(fileno(w.file)) == 0;
  const bool closed = std::fclose(w.file) == 0;
  w.file = nullptr;
  if (!flushed || !closed || std::rename(w.temp_path.c_str(), w.path.c_str()) != 0) {
    std::remove(w.temp_path.c_str());
    fail_runtime("cannot finish the memory timeline " + w.path, "check the disk has room");
  }
}

}  // namespace gradscope
