#include "gradscope/measure/clock.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace gradscope {
namespace {

TEST(SteadyClock, AdvancesWithRealTime) {
  SteadyClock clock;
  const double start_s = clock.now_s();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const double elapsed_s = clock.now_s() - start_s;
  EXPECT_GE(elapsed_s, 0.019);
  EXPECT_LT(elapsed_s, 5.0);  // loose: the machine is shared
}

TEST(FakeClock, MovesOnlyWhenTold) {
  FakeClock clock(10.0);
  EXPECT_EQ(clock.now_s(), 10.0);
  clock.advance(0.5);
  EXPECT_EQ(clock.now_s(), 10.5);
  clock.set(3.0);
  const Clock& as_interface = clock;
  EXPECT_EQ(as_interface.now_s(), 3.0);
}

TEST(Sync, IsANoOpOnCpu) { EXPECT_NO_THROW(sync(torch::Device(torch::kCPU))); }

TEST(Sync, WaitsForQueuedKernels_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  const torch::Device cuda(torch::kCUDA, 0);
  auto a = torch::randn({2048, 2048}, torch::TensorOptions().device(cuda));
  for (int i = 0; i < 8; ++i) a = a.matmul(a).tanh();
  EXPECT_NO_THROW(sync(cuda));
}

}  // namespace
}  // namespace gradscope
