// The memory timeline of real runs (`run --memory-timeline`, `--memory-snapshot` on the CPU):
// under every way of computing a step, its running total is the tracking allocator's live
// bytes after every event (the reader replays the events and refuses a file where they
// differ), its largest total is the allocator's own peak over the window, which the record
// gives, and what it names is what the run holds.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "gradscope/core/json_input.h"
#include "gradscope/core/memory_timeline.h"
#include "gradscope/core/record.h"
#include "test_util.h"

namespace gradscope {
namespace timeline_run {
namespace {

std::string args(const std::string& extra) {
  return fmt::format(
      "run --model llama --preset tiny --seq 32 --batch 4 --steps 3 --warmup-steps 1 "
      "--dropout 0 --eval-batches 1 --threads 1 --optimizer adam --lr 0.003 --sample-period 0 "
      "--dataset {} --quiet --no-db {}",
      testing::fixture("text/sotu-excerpt.txt"), extra);
}

RunRecord record_file(const std::string& path) {
  return record_from_json(parse_json_input(testing::slurp(path), path));
}

constexpr size_t index_of(MemoryComponent c) { return static_cast<size_t>(c); }

// Checks one timeline against the record of the run (or rank) that wrote it.
void expect_timeline_matches(const std::string& file, const RunRecord& r,
                             const std::string& what) {
  SCOPED_TRACE(what);
  const MemoryTimeline t = read_memory_timeline(file);
  const TimelineReplay replay = replay_memory_timeline(t, file);  // live == running total
  ASSERT_FALSE(t.meta.cap_reached);
  ASSERT_FALSE(replay.live.empty());
  // The window is the first timed step, and its peak is the allocator's.
  EXPECT_EQ(t.meta.first_step, 2);
  EXPECT_EQ(t.meta.last_step, 2);
  EXPECT_EQ(replay.peak_bytes, t.meta.window_peak_bytes);
  ASSERT_TRUE(r.memory.has_value());
  ASSERT_TRUE(r.memory->window.has_value());
  EXPECT_EQ(r.memory->window->peak_bytes, replay.peak_bytes);
  EXPECT_EQ(r.memory->window->first_step, 2);
  EXPECT_LE(replay.peak_bytes, r.memory->peak_bytes);
  // The phases' own peaks (the meter's register, reset at each phase) in that step: the
  // largest is the timeline's peak when it fell inside a phase.
  int64_t phases_peak = 0;
  for (const StepMemory& s : r.memory->timeline)
    if (s.step == 2)
      for (const PhaseMemory& p : s.phases) phases_peak = std::max(phases_peak, p.peak_bytes);
  ASSERT_GT(phases_peak, 0);
  EXPECT_EQ(phases_peak, replay.peak_bytes);
  // What was live when the window opened comes first; then the step's phases, in order.
  ASSERT_FALSE(t.meta.phases.empty());
  const int64_t opened = t.meta.phases.front().first_event;
  ASSERT_GT(opened, 0);
  EXPECT_EQ(t.meta.phases.back().end_event, static_cast<int64_t>(t.events.size()));
  for (size_t i = 1; i < t.meta.phases.size(); ++i)
    EXPECT_EQ(t.meta.phases[i].first_event, t.meta.phases[i - 1].end_event);
  // The parameters are named, whole, all through the step.
  for (size_t i = static_cast<size_t>(opened - 1); i < replay.by_component.size(); ++i)
    ASSERT_EQ(replay.by_component[i][index_of(MemoryComponent::kParameters)],
              r.memory->params_bytes)
        << "after event " << i;
  ASSERT_FALSE(replay.live_at_peak.empty());
}

TEST(MemoryTimelineRun, EveryStrategyReproducesTheTrackersTotalsAndPeak) {
  testing::TempDir dir("gradscope-timeline");
  const std::pair<const char*, const char*> runs[] = {
      {"standard", ""},
      {"checkpoint", "--strategy checkpoint"},
      {"chunked", "--loss chunked --loss-chunk 16"},
      {"accumulation", "--strategy accumulation --accum-steps 2"},
  };
  for (const auto& [name, flags] : runs) {
    const std::string file = dir.file(std::string(name) + ".timeline");
    const std::string json = dir.file(std::string(name) + ".json");
    const auto r = testing::run_gradscope(
        args(fmt::format("{} --memory-timeline {} --json {}", flags, file, json)));
    ASSERT_EQ(r.code, 0) << name << ": " << r.err;
    expect_timeline_matches(file, record_file(json), name);
  }
}

TEST(MemoryTimelineRun, EachFsdpRankWritesItsOwnTimeline) {
  testing::TempDir dir("gradscope-timeline");
  const std::string file = dir.file("fsdp.timeline");
  const std::string json = dir.file("fsdp.json");
  const auto r = testing::run_gradscope(
      args(fmt::format("--nproc 2 --shard fsdp --memory-timeline {} --json {}", file, json)));
  ASSERT_EQ(r.code, 0) << r.err;
  const RunRecord record = record_file(json);
  // Rank 0's record is the run's; each rank's file reproduces its own tracker.
  expect_timeline_matches(file + ".rank0", record, "rank 0");
  const MemoryTimeline rank1 = read_memory_timeline(file + ".rank1");
  const TimelineReplay replay = replay_memory_timeline(rank1, file + ".rank1");
  EXPECT_EQ(replay.peak_bytes, rank1.meta.window_peak_bytes);
  ASSERT_TRUE(record.distributed.has_value());
  // fsdp's gathered blocks and reduced buckets are labelled as the collectives' buffers.
  int64_t buffers = 0;
  for (const auto& at : replay.by_component)
    buffers = std::max(buffers, at[index_of(MemoryComponent::kCollectiveBuffers)]);
  EXPECT_GT(buffers, 0);
}

}  // namespace
}  // namespace timeline_run
}  // namespace gradscope
