#include "gradscope/measure/memory.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <malloc.h>
#include <sys/resource.h>
#include <torch/version.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_set>
#include <algorithm>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"

// The CUDA caching allocator's header is installed even by the CPU wheel, which lacks the
// library behind it. The CUDA macros header is generated only when LibTorch is built with
// CUDA, and the caching allocator's header cannot compile without it, so its presence is the
// test.
#if __has_include(<c10/cuda/impl/cuda_cmake_macros.h>)
#define GRADSCOPE_HAS_CUDA_STATS 1
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#else
#define GRADSCOPE_HAS_CUDA_STATS 0
#endif

#include <torch/version.h>
// The allocator's history (memory_viz's pickle) is recorded from C++.
#if GRADSCOPE_HAS_CUDA_STATS
#include <torch/csrc/cuda/memory_snapshot.h>
#endif

#include <fstream>

namespace gradscope {
namespace {

// LibTorch's CPU alignment (c10::gAlignment on x86-64); the header in front of each block
// takes one alignment unit so the data pointer keeps it.
constexpr size_t kAlignment = 64;
static_assert(kAlignment >= sizeof(size_t), "the header must hold the block size");

CpuMemoryTracker* g_tracker = nullptr;

[[noreturn]] void throw_cpu_oom(size_t nbytes, const std::string& why) {
  // The wording of LibTorch's own CPU allocator, so that code recognising an out-of-memory
  // failure by type or by message treats a capped run like a real one.
  TORCH_CHECK_WITH(OutOfMemoryError, false,
                   "DefaultCPUAllocator: not enough memory: you tried to allocate ", nbytes,
                   " bytes (out of memory: ", why, ")");
  std::abort();  // unreachable: TORCH_CHECK_WITH(false) throws
}

// The block's header: its size, then the label of the scope it was made in (or what it was
// found to be since), in the alignment unit in front of the data.
constexpr size_t kLabelOffset = sizeof(size_t);
static_assert(kLabelOffset + sizeof(uint32_t) <= kAlignment, "the header must hold the label");

// The raw deleter: the context is the data pointer (LibTorch's raw_allocate asserts it),
// and the block size sits in the header just before it.
void tracked_free(void* data) {
  if (data == nullptr) return;
  g_tracker->free_block(data);
}

c10::DataPtr tracked_allocate(size_t nbytes) {
  const c10::Device cpu(c10::DeviceType::CPU);
  if (nbytes == 0) return {nullptr, nullptr, &tracked_free, cpu};
  void* data = g_tracker->allocate_block(nbytes);
  return {data, data, &tracked_free, cpu};
}

struct TrackingAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override { return tracked_allocate(nbytes); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &tracked_free; }
};

// "VmHWM:    123456 kB" -> bytes; 0 when the field is missing.
int64_t proc_status_bytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t field_len = std::strlen(field);
  while (std::getline(in, line)) {
    if (line.compare(0, field_len, field) == 0 && line.size() > field_len &&
        line[field_len] == ':') {
      std::istringstream values(line.substr(field_len + 1));
      int64_t kib = 0;
      if (values >> kib) return kib * 1024;
    }
  }
  return 0;
}

class CpuMemoryMeter final : public MemoryMeter {
 public:
  CpuMemoryMeter() : tracker_(CpuMemoryTracker::install()) { tracker_.reset_peak(); }
  int64_t current_bytes() const override { return tracker_.current_bytes(); }
  int64_t peak_bytes() const override { return tracker_.peak_bytes(); }
  void reset_peak() override { tracker_.reset_peak(); }
  std::optional<int64_t> reserved_peak_bytes() const override { return std::nullopt; }

 private:
  CpuMemoryTracker& tracker_;
};

#if GRADSCOPE_HAS_CUDA_STATS
// Index 0 of each stat array is the aggregate over the small and large pools
// (StatType::AGGREGATE).
constexpr size_t kAggregate = 0;

class CudaMemoryMeter final : public MemoryMeter {
 public:
  explicit CudaMemoryMeter(c10::DeviceIndex index) : index_(index) { reset_peak(); }
  int64_t current_bytes() const override { return stats().allocated_bytes[kAggregate].current; }
  int64_t peak_bytes() const override { return stats().allocated_bytes[kAggregate].peak; }
  void reset_peak() override { c10::cuda::CUDACachingAllocator::resetPeakStats(index_); }
  std::optional<int64_t> reserved_peak_bytes() const override {
    return stats().reserved_bytes[kAggregate].peak;
  }

 private:
  // Its type moved from c10::cuda::CUDACachingAllocator to c10::CachingDeviceAllocator in
  // 2.x; the function that returns it did not.
  using DeviceStats = decltype(c10::cuda::CUDACachingAllocator::getDeviceStats(0));
  DeviceStats stats() const { return c10::cuda::CUDACachingAllocator::getDeviceStats(index_); }
  c10::DeviceIndex index_;
};
#endif

}  // namespace

namespace {

// A training step frees its activations and gradients and asks for the same sizes again in
// the next step. By default glibc serves large blocks with fresh mappings and trims the top
// of its heap when it frees, so every step faults in and zeroes those pages again: measured,
// a fifth of the small Llama's CPU step. Serving every block from the heap and never trimming
// it reuses the pages instead, at the price of a peak RSS higher by up to a third (freed
// memory stays with the process, and the heap fragments). GRADSCOPE_MALLOC=system keeps
// glibc's defaults (docs/metrics.md, "Memory").
void keep_freed_memory_in_the_heap() {
  const char* choice = std::getenv("GRADSCOPE_MALLOC");
  if (choice != nullptr && std::string(choice) == "system") return;
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
}

}  // namespace

CpuMemoryTracker& CpuMemoryTracker::install() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Both live for the rest of the process: LibTorch keeps the allocator pointer, and
    // blocks it made may be freed during static destruction.
    g_tracker = new CpuMemoryTracker();
    keep_freed_memory_in_the_heap();
    auto* allocator = new TrackingAllocator();
    // Highest priority: a later SetCPUAllocator of default priority must not displace it.
    c10::SetCPUAllocator(allocator, /*priority=*/UINT8_MAX);
    if (c10::GetCPUAllocator() != allocator) {
      fail_runtime("the CPU tracking allocator could not be installed",
                   "another CPU allocator was installed with top priority; CPU memory cannot be "
                   "measured in this process");
    }
  });
  return *g_tracker;
}

bool CpuMemoryTracker::installed() { return g_tracker != nullptr; }

void CpuMemoryTracker::reset_peak() {
  peak_bytes_.store(current_bytes_.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

void CpuMemoryTracker::set_cap(int64_t cap_bytes) {
  check_usage(cap_bytes >= 0, fmt::format("memory cap of {} bytes is negative", cap_bytes),
              "give a size such as 512MiB, or 0 for no cap");
  cap_bytes_.store(cap_bytes, std::memory_order_relaxed);
}

void CpuMemoryTracker::reserve(int64_t n, uint32_t label) {
  // A compare-exchange loop rather than add-then-undo, so that a refused allocation never
  // shows up in current or peak, even for a moment seen by another thread.
  int64_t current = current_bytes_.load(std::memory_order_relaxed);
  int64_t next = 0;
  do {
    const int64_t cap = cap_bytes_.load(std::memory_order_relaxed);
    next = current + n;
    if (cap > 0 && next > cap) {
      record_refusal(n, current, cap, label);
      throw_cpu_oom(static_cast<size_t>(n),
                    fmt::format("the memory cap of {} bytes would be exceeded; {} bytes in use",
                                cap, current));
    }
  } while (!current_bytes_.compare_exchange_weak(current, next, std::memory_order_relaxed));
  by_label_[label].fetch_add(n, std::memory_order_relaxed);
  for (std::atomic<int64_t>* peak : {&peak_bytes_, &window_peak_}) {
    int64_t seen = peak->load(std::memory_order_relaxed);
    while (next > seen && !peak->compare_exchange_weak(seen, next, std::memory_order_relaxed)) {
    }
  }
}

void CpuMemoryTracker::release(int64_t n, uint32_t label) {
  current_bytes_.fetch_sub(n, std::memory_order_relaxed);
  by_label_[label].fetch_sub(n, std::memory_order_relaxed);
}

void* CpuMemoryTracker::allocate_block(size_t nbytes) {
  const uint32_t label = current_memory_label();
  Observer* observer = observer_.load(std::memory_order_acquire);
  std::unique_lock<std::mutex> lock(observed_, std::defer_lock);
  if (observer != nullptr) lock.lock();
  reserve(static_cast<int64_t>(nbytes), label);
  void* base = nullptr;
  if (nbytes > SIZE_MAX - kAlignment ||
      posix_memalign(&base, kAlignment, nbytes + kAlignment) != 0) {
    release(static_cast<int64_t>(nbytes), label);
    throw_cpu_oom(nbytes, "the system refused the allocation");
  }
  std::memcpy(base, &nbytes, sizeof(nbytes));
  std::memcpy(static_cast<char*>(base) + kLabelOffset, &label, sizeof(label));
  void* data = static_cast<char*>(base) + kAlignment;
  if (observer != nullptr)
    observer->on_event(TimelineEventKind::kAlloc, reinterpret_cast<uint64_t>(data),
                       static_cast<int64_t>(nbytes), label, current_bytes(), label);
  return data;
}

void CpuMemoryTracker::free_block(void* data) {
  char* base = static_cast<char*>(data) - kAlignment;
  size_t nbytes = 0;
  uint32_t label = 0;
  Observer* observer = observer_.load(std::memory_order_acquire);
  std::unique_lock<std::mutex> lock(observed_, std::defer_lock);
  if (observer != nullptr) lock.lock();
  std::memcpy(&nbytes, base, sizeof(nbytes));
  std::memcpy(&label, base + kLabelOffset, sizeof(label));
  release(static_cast<int64_t>(nbytes), label);
  if (observer != nullptr)
    observer->on_event(TimelineEventKind::kFree, reinterpret_cast<uint64_t>(data),
                       static_cast<int64_t>(nbytes), label, current_bytes(), label);
  std::free(base);
}

bool CpuMemoryTracker::relabel(const at::Tensor& t, uint32_t label) {
  if (!t.defined() || !t.has_storage() || label >= kMaxMemoryLabels) return false;
  const c10::DataPtr& ptr = t.storage().data_ptr();
  if (ptr.get() == nullptr || ptr.get_deleter() != &tracked_free) return false;
  char* base = static_cast<char*>(ptr.get()) - kAlignment;
  Observer* observer = observer_.load(std::memory_order_acquire);
  std::unique_lock<std::mutex> lock(observed_, std::defer_lock);
  if (observer != nullptr) lock.lock();
  size_t nbytes = 0;
  uint32_t old_label = 0;
  std::memcpy(&nbytes, base, sizeof(nbytes));
  std::memcpy(&old_label, base + kLabelOffset, sizeof(old_label));
  if (old_label == label) return true;
  std::memcpy(base + kLabelOffset, &label, sizeof(label));
  by_label_[old_label].fetch_sub(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
  by_label_[label].fetch_add(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
  if (observer != nullptr)
    observer->on_event(TimelineEventKind::kRelabel, reinterpret_cast<uint64_t>(ptr.get()),
                       static_cast<int64_t>(nbytes), label, current_bytes(), old_label);
  return true;
}

void CpuMemoryTracker::start_window() {
  window_peak_.store(current_bytes_.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

std::vector<int64_t> CpuMemoryTracker::live_by_label() const {
  const uint32_t count = std::min(memory_label_count(), kMaxMemoryLabels);
  std::vector<int64_t> live(count);
  for (uint32_t i = 0; i < count; ++i) live[i] = by_label_[i].load(std::memory_order_relaxed);
  return live;
}

void CpuMemoryTracker::set_observer(Observer* observer, const std::vector<at::Tensor>& named) {
  const std::lock_guard<std::mutex> lock(observed_);
  if (observer != nullptr) {
    std::vector<int64_t> unnamed = live_by_label();
    std::unordered_set<const void*> seen;
    int64_t live = 0;
    for (const at::Tensor& t : named) {
      if (!t.defined() || !t.has_storage()) continue;
      const c10::DataPtr& ptr = t.storage().data_ptr();
      if (ptr.get() == nullptr || ptr.get_deleter() != &tracked_free) continue;
      if (!seen.insert(ptr.get()).second) continue;
      const char* base = static_cast<const char*>(ptr.get()) - kAlignment;
      size_t nbytes = 0;
      uint32_t label = 0;
      std::memcpy(&nbytes, base, sizeof(nbytes));
      std::memcpy(&label, base + kLabelOffset, sizeof(label));
      if (label < unnamed.size()) unnamed[label] -= static_cast<int64_t>(nbytes);
      live += static_cast<int64_t>(nbytes);
      observer->on_event(TimelineEventKind::kAlloc, reinterpret_cast<uint64_t>(ptr.get()),
                         static_cast<int64_t>(nbytes), label, live, label);
    }
    for (uint32_t label = 0; label < unnamed.size(); ++label) {
      if (unnamed[label] <= 0) continue;
      live += unnamed[label];
      observer->on_event(TimelineEventKind::kAlloc, 0, unnamed[label], label, live, label);
    }
  }
  observer_.store(observer, std::memory_order_release);
}

void CpuMemoryTracker::record_refusal(int64_t requested, int64_t live, int64_t cap,
                                      uint32_t label) {
  const std::lock_guard<std::mutex> lock(refusal_mutex_);
  if (refusal_) return;  // the first refusal is the one that ended the run
  MemoryRefusal r;
  r.requested_bytes = requested;
  r.live_bytes = live;
  r.cap_bytes = cap;
  r.request = memory_label(label);
  const std::vector<int64_t> by_label = live_by_label();
  for (uint32_t id = 0; id < by_label.size(); ++id)
    if (by_label[id] > 0) r.live.emplace_back(memory_label(id), by_label[id]);
  std::stable_sort(r.live.begin(), r.live.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  refusal_ = std::move(r);
}

std::optional<MemoryRefusal> CpuMemoryTracker::last_refusal() const {
  const std::lock_guard<std::mutex> lock(refusal_mutex_);
  return refusal_;
}

void CpuMemoryTracker::clear_refusal() {
  const std::lock_guard<std::mutex> lock(refusal_mutex_);
  refusal_.reset();
}

std::unique_ptr<MemoryMeter> make_memory_meter(const torch::Device& device) {
  if (device.is_cpu()) return std::make_unique<CpuMemoryMeter>();
  if (device.is_cuda()) {
#if GRADSCOPE_HAS_CUDA_STATS
    check_usage(torch::cuda::is_available(), "device cuda was asked for, but no GPU is visible",
                "check nvidia-smi and CUDA_VISIBLE_DEVICES, or use --device cpu");
    const c10::DeviceIndex index =
        device.has_index() ? device.index() : c10::cuda::current_device();
    check_usage(index >= 0 && index < static_cast<c10::DeviceIndex>(torch::cuda::device_count()),
                fmt::format("device {} does not exist: {} GPU(s) visible", device.str(),
                            torch::cuda::device_count()),
                "use --device cuda:0 .. cuda:N-1");
    return std::make_unique<CudaMemoryMeter>(index);
#else
    fail_usage(fmt::format("device {} was asked for, but this gradscope is built against a "
                           "LibTorch without CUDA ({})",
                           device.str(), TORCH_VERSION),
               "build against a CUDA LibTorch (docs/gpu.md), or use --device cpu");
#endif
  }
  fail_usage(fmt::format("memory cannot be measured on device {}", device.str()),
             "use --device cpu or cuda");
}

int64_t peak_rss_bytes() {
  if (const int64_t hwm = proc_status_bytes("VmHWM"); hwm > 0) return hwm;
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // kilobytes on Linux
}

int64_t current_rss_bytes() {
  if (const int64_t rss = proc_status_bytes("VmRSS"); rss > 0) return rss;
  std::ifstream statm("/proc/self/statm");
  int64_t size_pages = 0;
  int64_t resident_pages = 0;
  if (statm >> size_pages >> resident_pages) return resident_pages * sysconf(_SC_PAGESIZE);
  return 0;
}

void set_cuda_memory_cap(const torch::Device& device, int64_t cap_bytes) {
#if GRADSCOPE_HAS_CUDA_STATS
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  c10::cuda::CUDAGuard guard(index);
  size_t free_bytes = 0, total_bytes = 0;
  check_usage(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess,
              "cannot read the memory size of " + device.str(), "check nvidia-smi");
  const auto total = static_cast<int64_t>(total_bytes);
  check_usage(cap_bytes <= total,
              fmt::format("--memory-cap {} is more than the GPU's {}", format_bytes(cap_bytes),
                          format_bytes(total)),
              "pass a cap below the device's memory");
  // The caching allocator refuses to grow past this fraction with its usual out-of-memory
  // error, which the run records as oom.
  c10::cuda::CUDACachingAllocator::setMemoryFraction(
      static_cast<double>(cap_bytes) / static_cast<double>(total), index);
#else
  fail_usage("--memory-cap on " + device.str() + " needs a CUDA build of LibTorch",
             "use --device cpu, or rebuild against a CUDA LibTorch");
#endif
}

void clear_cuda_memory_cap(const torch::Device& device) {
#if GRADSCOPE_HAS_CUDA_STATS
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  c10::cuda::CUDACachingAllocator::setMemoryFraction(1.0, index);
#endif
}

bool memory_snapshot_supported(const torch::Device& device) {
  return device.is_cpu() || (GRADSCOPE_HAS_CUDA_STATS && device.is_cuda());
}

#if GRADSCOPE_HAS_CUDA_STATS
namespace {
// Each label as the caching allocator's user metadata, which every entry of its history
// keeps ("user_metadata" in memory_viz's snapshot): "component | module | phase".
void label_cuda_history(uint32_t id) {
  const TimelineLabel label = memory_label(id);
  c10::cuda::CUDACachingAllocator::setUserMetadata(
      fmt::format("{} | {} | {}", component_name(label.component),
                  label.module.empty() ? "unnamed" : label.module, label.phase));
}
}  // namespace
#endif

void start_memory_history() {
#if GRADSCOPE_HAS_CUDA_STATS
  // Every allocation and free with its C++ context, up to 100000 entries, each labelled.
  torch::cuda::_record_memory_history(true, true, int64_t{100000}, true, false);
  set_memory_label_listener(&label_cuda_history);
  label_cuda_history(current_memory_label());
#endif
}

void write_memory_snapshot(const std::string& path) {
#if GRADSCOPE_HAS_CUDA_STATS
  set_memory_label_listener(nullptr);
  const std::string pickled = torch::cuda::_memory_snapshot_pickled();
  std::ofstream out(path, std::ios::binary);
  check_usage(static_cast<bool>(out), "cannot write " + path, "check the directory exists");
  out.write(pickled.data(), static_cast<std::streamsize>(pickled.size()));
#else
  fail_usage("--memory-snapshot of a CUDA device needs a CUDA build of gradscope",
             "leave --memory-snapshot out, or use --device cpu");
#endif
}

}  // namespace gradscope
