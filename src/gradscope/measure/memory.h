// Memory measurement: what the allocator hands out (current and peak), what the process
// holds (RSS).
//
// CPU: LibTorch's allocator keeps no statistics, so gradscope installs its own tracking
// allocator with c10::SetCPUAllocator. It counts the bytes LibTorch asks for (not the
// 64-byte header it keeps in front of each block, nor malloc's own overhead), exactly,
// from every thread. CUDA: the caching allocator's own statistics (allocated bytes, and the
// reserved bytes it holds from the driver).
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "gradscope/core/memory_timeline.h"

namespace gradscope {

// What was live when the tracking allocator refused an allocation under --memory-cap: the
// request, who made it, and the live bytes by label (component, module, phase: the scope the
// allocation was made in, or what it was found to be since, core/memory_scope.h).
struct MemoryRefusal {
  int64_t requested_bytes = 0;
  int64_t live_bytes = 0;
  int64_t cap_bytes = 0;
  TimelineLabel request;
  std::vector<std::pair<TimelineLabel, int64_t>> live;  // largest first, no zero entries
};

// The process-wide CPU tracking allocator. Blocks LibTorch allocated before install() are
// neither counted nor disturbed: each DataPtr carries the deleter of the allocator that made
// it, so they go back to LibTorch's default allocator when freed.
class CpuMemoryTracker {
 public:
  // Installs the tracking allocator as LibTorch's CPU allocator; later calls return the same
  // tracker and change nothing. Throws a runtime error if LibTorch keeps another allocator.
  static CpuMemoryTracker& install();
  // Whether install() has run in this process.
  static bool installed();

  // Bytes of CPU tensor storage allocated through the tracker and not yet freed.
  int64_t current_bytes() const { return current_bytes_.load(std::memory_order_relaxed); }
  // The highest current_bytes() since install() or the last reset_peak().
  int64_t peak_bytes() const { return peak_bytes_.load(std::memory_order_relaxed); }
  // Starts a new peak window: peak := current.
  void reset_peak();

  // Allocations that would take current_bytes() above cap_bytes throw LibTorch's CPU
  // out-of-memory c10::OutOfMemoryError (a c10::Error) and count nothing; 0 means no cap.
  // This is how --memory-cap makes a CPU run fail the way a GPU run out of memory does.
  void set_cap(int64_t cap_bytes);
  int64_t cap_bytes() const { return cap_bytes_.load(std::memory_order_relaxed); }

  // The first refusal since install() or clear_refusal(), kept at the moment it happened
  // (nullopt when none).
  std::optional<MemoryRefusal> last_refusal() const;
  void clear_refusal();

  // Used by the allocator itself: reserve n bytes (throws past the cap), give them back.
  void reserve(int64_t n);
  void release(int64_t n) { current_bytes_.fetch_sub(n, std::memory_order_relaxed); }

 private:
  CpuMemoryTracker() = default;

  std::atomic<int64_t> current_bytes_{0};
  std::atomic<int64_t> peak_bytes_{0};
  std::atomic<int64_t> cap_bytes_{0};
};

// The allocator-level view of one device's memory, for one run.
class MemoryMeter {
 public:
  virtual ~MemoryMeter() = default;
  // Bytes of tensor storage allocated now.
  virtual int64_t current_bytes() const = 0;
  // The most allocated at once since the meter was made or the last reset_peak().
  virtual int64_t peak_bytes() const = 0;
  // Starts a new peak window (peak := current), e.g. after warm-up or per phase.
  virtual void reset_peak() = 0;
  // The most the allocator held from the system, cached blocks included (CUDA's reserved
  // bytes); nullopt where the allocator keeps no cache (CPU), so the record says null.
  virtual std::optional<int64_t> reserved_peak_bytes() const = 0;
};

// CPU: installs the tracking allocator if needed; make the meter before building the model,
// or the parameters (allocated by LibTorch's default allocator) are not counted. CUDA: the caching
// allocator's statistics for that device, with its peaks reset here so each run starts its own.
// Asking for CUDA from a build without CUDA, or with no GPU visible, is a usage error. Either way
// the peak starts at the current value.
std::unique_ptr<MemoryMeter> make_memory_meter(const torch::Device& device);

// --memory-cap on CUDA: the caching allocator may hold at most cap_bytes of the device (its
// memory fraction); past it allocations fail with CUDA's out-of-memory error.
void set_cuda_memory_cap(const torch::Device& device, int64_t cap_bytes);
// Lets the caching allocator use the whole device again (a no-op without CUDA).
void clear_cuda_memory_cap(const torch::Device& device);
// --memory-snapshot: whether this build and device can record the allocator's history
// (CUDA); start_memory_history() starts recording, write_memory_snapshot() writes
// the pickle that PyTorch's memory_viz page reads.
bool memory_snapshot_supported(const torch::Device& device);
void start_memory_history();
void write_memory_snapshot(const std::string& path);

// Peak resident set size of this process (VmHWM), in bytes; 0 when the system says nothing.
int64_t peak_rss_bytes();
// Resident set size now (VmRSS), in bytes; 0 when the system says nothing.
int64_t current_rss_bytes();

}  // namespace gradscope
