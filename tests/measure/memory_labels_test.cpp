// The labels of CPU allocations (core/memory_scope.h): which scope an allocation is made in,
// which module a backward node's allocations belong to, the live bytes per label, relabels,
// what a refusal under the cap keeps, and the timeline writer's cap.
#include <gtest/gtest.h>

#include <ATen/SequenceNumber.h>

#include <string>

#include "gradscope/core/memory_scope.h"
#include "gradscope/core/memory_timeline.h"
#include "gradscope/measure/memory.h"
#include "gradscope/measure/memory_window.h"
#include "test_util.h"

namespace gradscope {
namespace memory_labels {
namespace {

int64_t live_of(const TimelineLabel& label) {
  const std::vector<int64_t> live = CpuMemoryTracker::install().live_by_label();
  const uint32_t id = intern_memory_label(label);
  return id < live.size() ? live[id] : 0;
}

TEST(MemoryLabels, AnAllocationTakesTheLabelOfItsScope) {
  CpuMemoryTracker::install();
  set_memory_phase("forward");
  torch::Tensor a, b, c;
  {
    const MemoryScope block(std::string("layers.7"));
    a = torch::empty({1000}, torch::kFloat32);
    {
      const MemoryScope sub(std::string("attention"));
      b = torch::empty({2000}, torch::kFloat32);
    }
    const MemoryScope head(MemoryComponent::kLogits);
    c = torch::empty({3000}, torch::kFloat32);
  }
  EXPECT_EQ(live_of({MemoryComponent::kActivations, "layers.7", "forward"}), 4000);
  EXPECT_EQ(live_of({MemoryComponent::kActivations, "layers.7/attention", "forward"}), 8000);
  EXPECT_EQ(live_of({MemoryComponent::kLogits, "layers.7", "forward"}), 12000);
  EXPECT_EQ(current_memory_module(), "");
  // Found to be a gradient: its bytes move to that label, and go with it when freed.
  const uint32_t grad = intern_memory_label({MemoryComponent::kGradients, "w", ""});
  ASSERT_TRUE(CpuMemoryTracker::install().relabel(a, grad));
  EXPECT_EQ(live_of({MemoryComponent::kActivations, "layers.7", "forward"}), 0);
  EXPECT_EQ(live_of({MemoryComponent::kGradients, "w", ""}), 4000);
  a = torch::Tensor();
  EXPECT_EQ(live_of({MemoryComponent::kGradients, "w", ""}), 0);
  set_memory_phase("");
}

TEST(MemoryLabels, ABackwardNodeBelongsToTheInnermostModuleWhoseForwardMadeIt) {
  clear_module_ranges();
  const torch::Tensor x = torch::ones({4}, torch::requires_grad());
  uint64_t in_block = 0, in_mlp = 0, after_mlp = 0;
  {
    const MemoryScope block(std::string("layers.0"));
    torch::Tensor y = x * 2;
    in_block = at::sequence_number::peek() - 1;
    {
      const MemoryScope mlp(std::string("mlp"));
      y = y * 3;
      in_mlp = at::sequence_number::peek() - 1;
    }
    y = y + 1;
    after_mlp = at::sequence_number::peek() - 1;
  }
  ASSERT_LT(in_block, in_mlp);
  EXPECT_EQ(module_of_node(in_block)->path, "layers.0");
  EXPECT_EQ(module_of_node(in_mlp)->path, "layers.0/mlp");
  EXPECT_EQ(module_of_node(after_mlp)->path, "layers.0");
  EXPECT_FALSE(module_of_node(after_mlp + 1).has_value());
  clear_module_ranges();
  EXPECT_FALSE(module_of_node(in_block).has_value());
}

TEST(MemoryLabels, ARefusalKeepsTheRequestAndWhatWasLiveByLabel) {
  CpuMemoryTracker& tracker = CpuMemoryTracker::install();
  tracker.clear_refusal();
  torch::Tensor kept;
  {
    const MemoryScope scope(std::string("layers.1"));
    kept = torch::empty({1 << 16}, torch::kFloat32);
  }
  tracker.set_cap(tracker.current_bytes() + 1000);
  {
    const MemoryScope scope(std::string("layers.2"));
    EXPECT_THROW(torch::empty({1 << 16}, torch::kFloat32), c10::Error);
  }
  tracker.set_cap(0);
  const std::optional<MemoryRefusal> r = tracker.last_refusal();
  tracker.clear_refusal();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->requested_bytes, int64_t{4} << 16);
  EXPECT_EQ(r->request.module, "layers.2");
  int64_t sum = 0, block1 = 0;
  for (const auto& [label, bytes] : r->live) {
    sum += bytes;
    if (label.module == "layers.1") block1 += bytes;
  }
  EXPECT_EQ(sum, r->live_bytes);
  EXPECT_EQ(block1, int64_t{4} << 16);
}

TEST(MemoryLabels, TheWriterCountsWhatItsCapLeavesOut) {
  testing::TempDir dir("gradscope-labels");
  const std::string path = dir.file("t.timeline");
  {
    // The cap leaves no room past the part kept for the file's end: every event is dropped.
    TimelineWriter w(path, int64_t{1} << 20);
    for (int i = 0; i < 10; ++i)
      w.add({TimelineEventKind::kAlloc, 0, 0, 8, 8, 0});
    EXPECT_EQ(w.written(), 0);
    EXPECT_EQ(w.dropped(), 10);
    TimelineMeta meta;
    meta.labels.push_back({});
    w.finish(meta);
  }
  const MemoryTimeline t = read_memory_timeline(path);
  EXPECT_TRUE(t.meta.cap_reached);
  EXPECT_EQ(t.meta.dropped_events, 10);
  EXPECT_TRUE(t.events.empty());
}

}  // namespace
}  // namespace memory_labels
}  // namespace gradscope
