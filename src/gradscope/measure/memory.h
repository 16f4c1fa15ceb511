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

#include <array>
#include <atomic>
#include <mutex>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "gradscope/core/memory_scope.h"
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

  // A second peak register for a window of its own (a memory timeline's steps), which the
  // per-phase resets of reset_peak() leave alone: start_window() sets it to current.
  void start_window();
  int64_t window_peak_bytes() const { return window_peak_.load(std::memory_order_relaxed); }

  // Live bytes by label now (index = label id, core/memory_scope.h); ids past the vector's end
  // have none.
  std::vector<int64_t> live_by_label() const;
  // The block of `t`'s storage is, for its whole life, of `label` (a gradient, a parameter,
  // optimizer state): its bytes move to that label, and an observer hears of it. Returns
  // false, changing nothing, for storage the tracker did not allocate (or empty storage).
  bool relabel(const at::Tensor& t, uint32_t label);

  // Told of every allocation, free and relabel while set, under one lock with the change, so
  // that `live` is exactly the running total after it. One observer at a time; nullptr ends.
  // Setting one first tells it, as kAlloc events, what is live already: each block of the
  // `named` tensors' storage (once per block, with its label), then per label the bytes no
  // named block holds (address 0). Set it between steps: an allocation another thread makes
  // while it is being set may go unseen. An observer must not allocate tensors.
  class Observer {
   public:
    virtual ~Observer() = default;
    // `previous` is the label a relabelled block had (for other kinds, `label`).
    virtual void on_event(TimelineEventKind kind, uint64_t address, int64_t bytes,
                          uint32_t label, int64_t live, uint32_t previous) = 0;
  };
  void set_observer(Observer* observer, const std::vector<at::Tensor>& named = {});

  // Used by the allocator itself.
  void* allocate_block(size_t nbytes);
  void free_block(void* data);

 private:
  CpuMemoryTracker() = default;
  void reserve(int64_t n, uint32_t label);
  void release(int64_t n, uint32_t label);
  void record_refusal(int64_t requested, int64_t live, int64_t cap, uint32_t label);

  std::atomic<int64_t> current_bytes_{0};
  std::atomic<int64_t> peak_bytes_{0};
  std::atomic<int64_t> window_peak_{0};
  std::atomic<int64_t> cap_bytes_{0};
  std::array<std::atomic<int64_t>, kMaxMemoryLabels> by_label_{};
  std::atomic<Observer*> observer_{nullptr};
  mutable std::mutex observed_;  // held around a change while an observer is set
  mutable std::mutex refusal_mutex_;
  std::optional<MemoryRefusal> refusal_;
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
// --memory-snapshot: whether this build and device can record the allocator's history (the
// CPU's is a memory timeline, measure/memory_viz.h; CUDA's the caching allocator's).
// start_memory_history() starts CUDA's, write_memory_snapshot() writes it as the pickle that
// PyTorch's memory_viz page reads.
bool memory_snapshot_supported(const torch::Device& device);
void start_memory_history();
void write_memory_snapshot(const std::string& path);

// Peak resident set size of this process (VmHWM), in bytes; 0 when the system says nothing.
int64_t peak_rss_bytes();
// Resident set size now (VmRSS), in bytes; 0 when the system says nothing.
int64_t current_rss_bytes();

}  // namespace gradscope
