#include "gradscope/measure/memory.h"

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
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
  // raw_allocate asserts that the context equals the data pointer (DESIGN.md pitfalls).
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
    EXPECT_EQ(e.kind(), ErrorKind::kErrorKindUsage);
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
  char* buffer = static_cast<char*>(std::malloc(size));
  ASSERT_NE(buffer, nullptr);
  std::memset(buffer, 1, size);  // touching the pages is what makes them resident
  const int64_t grown = peak_rss_bytes();
  EXPECT_GE(grown, peak + kMargin / 2) << "peak " << peak << " -> " << grown;
  EXPECT_GE(current_rss_bytes(), current + kMargin / 2);
  volatile char sink = buffer[size / 2];
  (void)sink;
  std::free(buffer);
}

TEST(TensorsBytes, CountsSharedStorageOnce) {
  auto a = torch::zeros({10, 10});              // 400 bytes
  auto view = a.slice(0, 0, 2);                 // shares a's storage
  auto b = torch::zeros({5}, torch::kFloat64);  // 40 bytes
  torch::Tensor undefined;
  EXPECT_EQ(tensors_bytes({a}), 400);
  EXPECT_EQ(tensors_bytes({a, view, a, b, undefined}), 440);
  EXPECT_EQ(tensors_bytes({view}), 400);  // a view keeps its whole storage alive
  EXPECT_EQ(tensors_bytes({}), 0);
}

TEST(GradsBytes, OnlyDefinedGradients) {
  auto w = torch::ones({3, 4}, torch::requires_grad());
  auto v = torch::ones({5}, torch::requires_grad());
  EXPECT_EQ(grads_bytes({w, v}), 0);
  (w.sum() * 2).backward();
  EXPECT_EQ(grads_bytes({w, v}), 48);
}

// A small model's parameters and one optimizer step on a fixed problem.
struct Problem {
  torch::nn::Linear linear{torch::nn::LinearOptions(8, 3)};
  std::vector<torch::Tensor> params() { return linear->parameters(); }
  int64_t params_bytes() { return tensors_bytes(params()); }
  void step(torch::optim::Optimizer& optimizer) {
    optimizer.zero_grad();
    linear(torch::ones({4, 8})).pow(2).sum().backward();
    optimizer.step();
  }
};

TEST(OptimizerStateBytes, BuiltinOptimizers) {
  {
    Problem p;
    torch::optim::Adam adam(p.params(), torch::optim::AdamOptions(1e-3));
    EXPECT_EQ(optimizer_state_bytes(adam), 0);  // state is created lazily
    p.step(adam);
    EXPECT_EQ(optimizer_state_bytes(adam), 2 * p.params_bytes());
  }
  {
    Problem p;
    torch::optim::Adam amsgrad(p.params(), torch::optim::AdamOptions(1e-3).amsgrad(true));
    p.step(amsgrad);
    EXPECT_EQ(optimizer_state_bytes(amsgrad), 3 * p.params_bytes());
  }
  {
    Problem p;
    torch::optim::AdamW adamw(p.params(), torch::optim::AdamWOptions(1e-3));
    p.step(adamw);
    EXPECT_EQ(optimizer_state_bytes(adamw), 2 * p.params_bytes());
  }
  {
    Problem p;
    // Adagrad creates its `sum` state in the constructor.
    torch::optim::Adagrad adagrad(p.params(), torch::optim::AdagradOptions(1e-2));
    p.step(adagrad);
    EXPECT_EQ(optimizer_state_bytes(adagrad), p.params_bytes());
  }
  {
    Problem p;
    torch::optim::SGD plain(p.params(), torch::optim::SGDOptions(0.1));
    p.step(plain);
    EXPECT_EQ(optimizer_state_bytes(plain), 0);
  }
  {
    Problem p;
    torch::optim::SGD momentum(p.params(), torch::optim::SGDOptions(0.1).momentum(0.9));
    p.step(momentum);
    EXPECT_EQ(optimizer_state_bytes(momentum), p.params_bytes());
  }
  {
    Problem p;
    torch::optim::RMSprop centered(p.params(),
                                   torch::optim::RMSpropOptions(1e-2).centered(true).momentum(0.9));
    p.step(centered);
    EXPECT_EQ(optimizer_state_bytes(centered), 3 * p.params_bytes());
  }
}

// An optimizer of the kind gradscope adds: its param state reports its own tensors.
struct CountedState : public torch::optim::OptimizerCloneableParamState<CountedState>,
                      public StateBytes {
  torch::Tensor buffer;
  std::vector<torch::Tensor> state_tensors() const override { return {buffer}; }
};
struct UncountedState : public torch::optim::OptimizerCloneableParamState<UncountedState> {
  torch::Tensor buffer;
};

// The state map's key is a string in LibTorch 1.13 and the TensorImpl pointer in 2.x.
template <class Key>
Key state_key(const torch::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;
    key << p.unsafeGetTensorImpl();
    return key.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

class StatefulOptimizer : public torch::optim::Optimizer {
 public:
  StatefulOptimizer(std::vector<torch::Tensor> params, bool counted)
      : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                                std::make_unique<torch::optim::SGDOptions>(0.1)) {
    for (const auto& p : param_groups_[0].params()) {
      const auto key = state_key<std::decay_t<decltype(state_)>::key_type>(p);
      if (counted) {
        auto s = std::make_unique<CountedState>();
        s->buffer = torch::zeros_like(p);
        state_[key] = std::move(s);
      } else {
        auto s = std::make_unique<UncountedState>();
        s->buffer = torch::zeros_like(p);
        state_[key] = std::move(s);
      }
    }
  }
  torch::Tensor step(LossClosure closure = nullptr) override { return {}; }
  void save(torch::serialize::OutputArchive&) const override {}
  void load(torch::serialize::InputArchive&) override {}
};

TEST(OptimizerStateBytes, CustomStatesImplementStateBytes) {
  Problem p;
  StatefulOptimizer counted(p.params(), /*counted=*/true);
  EXPECT_EQ(optimizer_state_bytes(counted), p.params_bytes());
  StatefulOptimizer uncounted(p.params(), /*counted=*/false);
  try {
    optimizer_state_bytes(uncounted);
    FAIL() << "an unknown state type must not count as 0";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kErrorKindRuntime);
    EXPECT_NE(e.hint().find("StateBytes"), std::string::npos);
  }
}

}  // namespace
}  // namespace gradscope
