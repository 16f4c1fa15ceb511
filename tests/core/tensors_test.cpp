#include "gradscope/core/tensors.h"

#include <gtest/gtest.h>

namespace gradscope {
namespace {

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

}  // namespace
}  // namespace gradscope
