#include "gradscope/measure/memory.h"

#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gradscope/core/error.h"

namespace gradscope {
namespace {

// Restores the cap whatever a test does, so a failing test cannot break the next one.
struct CapGuard {
  ~CapGuard() { CpuMemoryTracker::install().set_cap(0); }
};

// Runs first in this file (and alone under ctest, which starts one process per test), so
// the tracker is usually not installed yet; in a run where another test got there first the
// situation cannot be set up and the test is skipped.
TEST(CpuMemoryTracker, BlocksFromTheDefaultAllocatorAreFreedByIt) {
  if (CpuMemoryTracker::installed()) GTEST_SKIP() << "tracker installed by an earlier test";
  auto before = torch::ones({1000});  // allocated by LibTorch's default allocator
  CpuMemoryTracker& tracker = CpuMemoryTracker::install();
  EXPECT_EQ(tracker.current_bytes(), 0);
  auto after = torch::ones({1000});
  EXPECT_EQ(tracker.current_bytes(), 4000);
  before = torch::Tensor();  // must go back to the default allocator, not be subtracted
  EXPECT_EQ(tracker.current_bytes(), 4000);
  after = torch::Tensor();
  EXPECT_EQ(tracker.current_bytes(), 0);
}

TEST(CpuMemoryTracker, InstallIsIdempotent) {
  CpuMemoryTracker& a = CpuMemoryTracker::install();
  CpuMemoryTracker& b = CpuMemoryTracker::install();
  EXPECT_EQ(&a, &b);
  EXPECT_TRUE(CpuMemoryTracker::installed());
  auto t = torch::zeros({10});
  const int64_t with = a.current_bytes();
  t = torch::Tensor();
  EXPECT_EQ(a.current_bytes(), with - 40);  // counted once, not once per install
}

TEST(CpuMemoryTracker, CountsExactBytesAndPeak) {
  CpuMemoryTracker& tracker = CpuMemoryTracker::install();
  const int64_t base = tracker.current_bytes();
  tracker.reset_peak();
  EXPECT_EQ(tracker.peak_bytes(), base);
  constexpr int64_t kN = 12345;
  {
    auto a = torch::empty({kN}, torch::kFloat32);
    EXPECT_EQ(tracker.current_bytes(), base + 4 * kN);
    {
      auto b = torch::empty({kN}, torch::kFloat64);
      EXPECT_EQ(tracker.current_bytes(), base + 12 * kN);
    }
    EXPECT_EQ(tracker.current_bytes(), base + 4 * kN);
    EXPECT_EQ(tracker.peak_bytes(), base + 12 * kN);
  }
  EXPECT_EQ(tracker.current_bytes(), base);
  EXPECT_EQ(tracker.peak_bytes(), base + 12 * kN);
  tracker.reset_peak();
  EXPECT_EQ(tracker.peak_bytes(), base);
}

TEST(CpuMemoryTracker, BlocksAreAlignedAndUsable) {
  CpuMemoryTracker::install();
  for (int64_t n : {1, 3, 17, 1000, 100000}) {
    auto t = torch::arange(n, torch::kFloat64);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u) << "n=" << n;
    EXPECT_EQ(t.sum().item<double>(), static_cast<double>(n) * (n - 1) / 2) << "n=" << n;
  }
  // raw_allocate asserts that the context equals the data pointer, so the tracking allocator
  // must hand back the pointer itself as the context.
  c10::Allocator* allocator = c10::GetCPUAllocator();
  void* raw = allocator->raw_allocate(100);
  ASSERT_NE(raw, nullptr);
  allocator->raw_deallocate(raw);
}

TEST(CpuMemoryTracker, ExactUnderConcurrentAllocation) {
  CpuMemoryTracker& tracker = CpuMemoryTracker::install();
  const int64_t base = tracker.current_bytes();
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([] {
      for (int k = 0; k < 2000; ++k) auto t = torch::empty({k % 97 + 1});
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(tracker.current_bytes(), base);
}

TEST(CpuMemoryTracker, CapThrowsLibTorchOutOfMemoryAndCountsNothing) {
  CpuMemoryTracker& tracker = CpuMemoryTracker::install();
  CapGuard guard;
  const int64_t base = tracker.current_bytes();
  tracker.reset_peak();
  tracker.set_cap(base + 1000 * 4);
  auto fits = torch::empty({1000});  // exactly at the cap
  EXPECT_EQ(tracker.current_bytes(), base + 4000);
  try {
    auto too_much = torch::empty({1});
    FAIL() << "expected an out-of-memory error";
  } catch (const c10::OutOfMemoryError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("out of memory"), std::string::npos) << what;
    EXPECT_NE(what.find("DefaultCPUAllocator"), std::string::npos) << what;
  }
  EXPECT_EQ(tracker.current_bytes(), base + 4000);
  EXPECT_EQ(tracker.peak_bytes(), base + 4000);
  // Also caught as a plain c10::Error, as callers that sort failures do.
  EXPECT_THROW(torch::empty({1}), c10::Error);
  tracker.set_cap(0);
  auto now_fine = torch::empty({1000});
  EXPECT_EQ(tracker.current_bytes(), base + 8000);
  EXPECT_THROW(tracker.set_cap(-1), Error);
}

TEST(MemoryMeter, CpuMeterFollowsTheTracker) {
  auto meter = make_memory_meter(torch::Device(torch::kCPU));
  EXPECT_FALSE(meter->reserved_peak_bytes().has_value());
  const int64_t base = meter->current_bytes();
  EXPECT_EQ(meter->peak_bytes(), base);
  {
    auto t = torch::empty({256});
    EXPECT_EQ(meter->current_bytes(), base + 1024);
  }
  EXPECT_EQ(meter->peak_bytes(), base + 1024);
  meter->reset_peak();
  EXPECT_EQ(meter->peak_bytes(), base);
}

TEST(MemoryMeter, CudaIsAUsageErrorWithoutCuda) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a GPU is visible";
  try {
    make_memory_meter(torch::Device(torch::kCUDA));
    FAIL() << "expected a usage error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(e.hint().find("--device cpu"), std::string::npos);
  }
}

TEST(MemoryMeter, CudaPeakAndReserved_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  auto meter = make_memory_meter(torch::Device(torch::kCUDA, 0));
  const int64_t base = meter->current_bytes();
  {
    auto t = torch::empty({1 << 20}, torch::TensorOptions().device(torch::kCUDA, 0));
    EXPECT_EQ(meter->current_bytes(), base + 4 * (1 << 20));
  }
  EXPECT_EQ(meter->current_bytes(), base);
  EXPECT_GE(meter->peak_bytes(), base + 4 * (1 << 20));
  ASSERT_TRUE(meter->reserved_peak_bytes().has_value());
  EXPECT_GE(*meter->reserved_peak_bytes(), meter->peak_bytes());
  meter->reset_peak();
  EXPECT_EQ(meter->peak_bytes(), base);
}

TEST(Rss, PeakIsPositiveAndGrowsWhenABufferIsTouched) {
  const int64_t current = current_rss_bytes();
  const int64_t peak = peak_rss_bytes();
  EXPECT_GT(current, 0);
  EXPECT_GE(peak, current);
  // Enough to pass the old peak whatever earlier tests did, plus a margin to see.
  constexpr int64_t kMargin = 64LL << 20;
  const size_t size = static_cast<size_t>(peak - current + kMargin);
  // Fresh pages from the kernel: malloc may hand back heap pages earlier tests left resident.
  void* mapped = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  char* buffer = static_cast<char*>(mapped);
  std::memset(buffer, 1, size);  // touching the pages is what makes them resident
  const int64_t grown = peak_rss_bytes();
  EXPECT_GE(grown, peak + kMargin / 2) << "peak " << peak << " -> " << grown;
  EXPECT_GE(current_rss_bytes(), current + kMargin / 2);
  volatile char sink = buffer[size / 2];
  (void)sink;
  munmap(mapped, size);
}

}  // namespace
}  // namespace gradscope
