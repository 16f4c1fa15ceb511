// Memory timelines read back: a file laid out byte by byte reads back as written and replays to
// the totals worked out by hand, and every kind of broken or hostile file is a usage error
// naming the file before anything it claims is allocated.
#include "gradscope/core/memory_timeline.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <string>
#include <vector>

#include "gradscope/core/error.h"
#include "test_util.h"
#include "timeline_sample.h"

namespace gradscope {
namespace memory_timeline_test {
namespace {

using testing::sample_timeline;
using testing::timeline_file;
using testing::timeline_le;
constexpr char kWhat[] = "/data/window.gsmt";
constexpr size_t kComponents = static_cast<size_t>(MemoryComponent::kCount);

int64_t at(const TimelineReplay& r, int64_t event, MemoryComponent c) {
  return r.by_component[event][static_cast<size_t>(c)];
}

// The message of the usage error parsing `bytes` gives (and replaying them, once they parse).
std::string refusal(const std::string& bytes) {
  const Error e = testing::expect_usage_error([&] {
    const MemoryTimeline t = parse_memory_timeline(bytes, kWhat);
    replay_memory_timeline(t, kWhat);
  });
  EXPECT_TRUE(testing::contains(e.what(), kWhat)) << e.what();
  return e.what();
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(MemoryTimeline, ComponentNamesGoBothWays) {
  for (size_t i = 0; i < kComponents; ++i) {
    const auto c = static_cast<MemoryComponent>(i);
    EXPECT_EQ(parse_component(component_name(c)), c) << component_name(c);
  }
  EXPECT_STREQ(component_name(MemoryComponent::kOptimizerState), "optimizer state");
  EXPECT_FALSE(parse_component("Parameters"));
  EXPECT_FALSE(parse_component(""));
}

TEST(MemoryTimeline, MetaRoundTripsThroughJson) {
  const TimelineMeta m = sample_timeline().meta;
  const TimelineMeta back = timeline_meta_from_json(timeline_meta_to_json(m), kWhat);
  EXPECT_EQ(timeline_meta_to_json(back), timeline_meta_to_json(m));
  EXPECT_EQ(back.run_id, "sample-run");
  ASSERT_EQ(back.labels.size(), 5u);
  EXPECT_EQ(back.labels[4].component, MemoryComponent::kOptimizerState);
  EXPECT_EQ(back.labels[2].module, "block 0 attention");
  ASSERT_EQ(back.phases.size(), 3u);
  EXPECT_EQ(back.phases[1].phase, "backward");
  EXPECT_EQ(back.phases[1].end_event, 6);
  ASSERT_EQ(back.tensors.size(), 2u);
  EXPECT_EQ(back.tensors[0].shape, (std::vector<int64_t>{10, 100}));
  EXPECT_EQ(back.estimate.at("optimizer state"), 8000);
  EXPECT_EQ(back.window_peak_bytes, 15000);
}

TEST(MemoryTimeline, AFileReadsBackAsWrittenFromBytesAndFromDisk) {
  const MemoryTimeline t = sample_timeline();
  testing::TempDir dir("gradscope-timeline");
  for (size_t chunk : {1, 4, 100}) {
    const std::string bytes = timeline_file(t.events, timeline_meta_to_json(t.meta), chunk);
    write(dir.file("t.gsmt"), bytes);
    for (const MemoryTimeline& back :
         {parse_memory_timeline(bytes, kWhat), read_memory_timeline(dir.file("t.gsmt"))}) {
      ASSERT_EQ(back.events.size(), t.events.size());
      for (size_t i = 0; i < t.events.size(); ++i) {
        EXPECT_EQ(back.events[i].kind, t.events[i].kind) << i;
        EXPECT_EQ(back.events[i].label, t.events[i].label) << i;
        EXPECT_EQ(back.events[i].address, t.events[i].address) << i;
        EXPECT_EQ(back.events[i].bytes, t.events[i].bytes) << i;
        EXPECT_EQ(back.events[i].live, t.events[i].live) << i;
        EXPECT_EQ(back.events[i].t_ns, t.events[i].t_ns) << i;
      }
      EXPECT_EQ(timeline_meta_to_json(back.meta), timeline_meta_to_json(t.meta));
    }
  }
}

TEST(MemoryTimeline, WhatTheWriterWritesReadsBackAndReplays) {
  MemoryTimeline t = sample_timeline();
  t.meta.cap_bytes = 0;  // no cap: what the writer says of a writer made with none
  testing::TempDir dir("gradscope-timeline");
  const std::string path = dir.file("w.gsmt");
  {
    TimelineWriter w(path, 0);
    for (const TimelineEvent& e : t.events) w.add(e);
    w.finish(t.meta);
  }
  const MemoryTimeline back = read_memory_timeline(path);
  EXPECT_EQ(timeline_meta_to_json(back.meta), timeline_meta_to_json(t.meta));
  ASSERT_EQ(back.events.size(), t.events.size());
  for (size_t i = 0; i < t.events.size(); ++i) {
    EXPECT_EQ(back.events[i].address, t.events[i].address) << i;
    EXPECT_EQ(back.events[i].live, t.events[i].live) << i;
  }
  EXPECT_EQ(replay_memory_timeline(back, path).peak_bytes, 15000);
  // Under a cap that holds four events (and the room the writer keeps for the JSON part) the
  // rest are dropped, and the file says so and still reads back.
  MemoryTimeline capped = sample_timeline();
  capped.meta.phases = {{1, "forward", 2, 4}};
  capped.meta.tensors.resize(1);
  {
    TimelineWriter w(path, (int64_t{1} << 20) + 16 + 4 * 37);
    for (const TimelineEvent& e : capped.events) w.add(e);
    EXPECT_EQ(w.written(), 4);
    EXPECT_EQ(w.dropped(), 5);
    w.finish(capped.meta);
  }
  const MemoryTimeline cut = read_memory_timeline(path);
  EXPECT_TRUE(cut.meta.cap_reached);
  EXPECT_EQ(cut.meta.dropped_events, 5);
  ASSERT_EQ(cut.events.size(), 4u);
  EXPECT_EQ(replay_memory_timeline(cut, path).peak_bytes, 10000);
}

TEST(MemoryTimeline, ReplayAppliesRelabelsToTheWholeLifeAndFindsThePeak) {
  const TimelineReplay r = replay_memory_timeline(sample_timeline(), kWhat);
  ASSERT_EQ(r.live.size(), 9u);
  EXPECT_EQ(r.peak_bytes, 15000);
  EXPECT_EQ(r.peak_event, 6);
  // The block at 0x3000 was relabelled a gradient after event 5: it is one from event 3 on.
  EXPECT_EQ(at(r, 3, MemoryComponent::kGradients), 2000);
  EXPECT_EQ(at(r, 3, MemoryComponent::kActivations), 3000);
  EXPECT_EQ(at(r, 6, MemoryComponent::kOptimizerState), 8000);
  EXPECT_EQ(at(r, 6, MemoryComponent::kParameters), 4000);
  EXPECT_EQ(at(r, 6, MemoryComponent::kOther), 1000);
  // The free of an address never allocated in the window takes from its label's unnamed bytes.
  EXPECT_EQ(at(r, 7, MemoryComponent::kOther), 500);
  for (size_t i = 0; i < r.live.size(); ++i) {
    int64_t sum = 0;
    for (int64_t v : r.by_component[i]) sum += v;
    EXPECT_EQ(sum, r.live[i]) << i;
  }
  ASSERT_EQ(r.live_at_peak.size(), 4u);
  EXPECT_EQ(r.live_at_peak[0].bytes, 8000);
  EXPECT_EQ(r.live_at_peak[0].alloc_event, 6);
  EXPECT_EQ(r.live_at_peak[0].label, 4u);
  EXPECT_EQ(r.live_at_peak[1].address, 0x1000u);
  EXPECT_EQ(r.live_at_peak[2].label, 3u);  // its final label
  EXPECT_EQ(r.live_at_peak[3].alloc_event, -1);
  EXPECT_EQ(r.live_at_peak[3].bytes, 1000);
}

TEST(MemoryTimelineHostile, TruncatedOrWrongMagicIsRefused) {
  const std::string good = testing::sample_timeline_file();
  for (size_t cut : {size_t{0}, size_t{5}, size_t{40}, good.size() - 1})
    EXPECT_TRUE(testing::contains(refusal(good.substr(0, cut)), cut < 8 ? "GSMEMTL1" : "cut short"))
        << cut;
  std::string magic = good;
  magic[3] = 'X';
  EXPECT_TRUE(testing::contains(refusal(magic), "no memory timeline"));
}

TEST(MemoryTimelineHostile, CountsPastTheFileAreRefusedBeforeAllocating) {
  const MemoryTimeline t = sample_timeline();
  const std::string meta = timeline_meta_to_json(t.meta);
  // A chunk that says more events than the JSON part.
  std::string chunk = timeline_file(t.events, meta, 100);
  chunk.replace(12, 4, timeline_le(uint32_t{60000}));
  EXPECT_TRUE(testing::contains(refusal(chunk), "more events than the 9 its JSON part says"));
  // A last chunk that says more events than the file holds (chunks of one event, 45 bytes
  // each, so that ten events' 370 bytes fit in the 405 before the JSON part).
  TimelineMeta ten = t.meta;
  ten.events = 10;
  std::string past = timeline_file(t.events, timeline_meta_to_json(ten), 1);
  past.replace(8 + 8 * 45 + 4, 4, timeline_le(uint32_t{2}));
  EXPECT_TRUE(testing::contains(refusal(past), "says 2 events, past the end of the events"));
  // A JSON part that says a billion events (past the limit) and one that says more than fit.
  TimelineMeta many = t.meta;
  many.events = int64_t{1} << 40;
  EXPECT_TRUE(testing::contains(refusal(timeline_file(t.events, timeline_meta_to_json(many))),
                                "more than the"));
  many.events = 1000;
  EXPECT_TRUE(testing::contains(refusal(timeline_file(t.events, timeline_meta_to_json(many))),
                                "hold at most 9"));
  // A trailer that points outside the file.
  std::string trailer = testing::sample_timeline_file();
  trailer.replace(trailer.size() - 16, 8, timeline_le(uint64_t{1} << 62));
  EXPECT_TRUE(testing::contains(refusal(trailer), "outside"));
}

TEST(MemoryTimelineHostile, AMetaLengthPastTheCapIsRefused) {
  const MemoryTimeline t = sample_timeline();
  std::string bytes = "GSMEMTL1" + testing::timeline_chunks(t.events, 4);
  const uint64_t meta_at = bytes.size();
  bytes += "META" + timeline_le(kTimelineMaxMetaBytes + 1) + "{}";
  bytes += timeline_le(meta_at) + "GSMEMEND";
  EXPECT_TRUE(testing::contains(refusal(bytes), "past the cap"));
}

TEST(MemoryTimelineHostile, BadIndicesKindsAndRangesAreRefused) {
  auto with = [&](auto change) {
    MemoryTimeline bad = sample_timeline();
    change(bad);
    return refusal(timeline_file(bad.events, timeline_meta_to_json(bad.meta)));
  };
  EXPECT_TRUE(testing::contains(with([](MemoryTimeline& b) { b.events[2].label = 99; }),
                                "label 99, past the 5 labels"));
  EXPECT_TRUE(testing::contains(
      with([](MemoryTimeline& b) { b.events[2].kind = static_cast<TimelineEventKind>(7); }),
      "kind 7"));
  EXPECT_TRUE(testing::contains(with([](MemoryTimeline& b) { b.events[2].bytes = -5; }),
                                "not a positive size"));
  EXPECT_TRUE(testing::contains(with([](MemoryTimeline& b) { b.meta.tensors[1].event = 9; }),
                                "past the 9 events"));
  EXPECT_TRUE(testing::contains(with([](MemoryTimeline& b) { b.meta.tensors[1].event = 4; }),
                                "allocates nothing"));
  EXPECT_TRUE(testing::contains(with([](MemoryTimeline& b) { b.meta.phases[1].first_event = 3; }),
                                "phases[1]"));
  EXPECT_TRUE(testing::contains(with([](MemoryTimeline& b) { b.meta.phases[2].end_event = 10; }),
                                "phases[2]"));
  EXPECT_TRUE(testing::contains(
      with([](MemoryTimeline& b) { b.meta.tensors[0].shape.assign(17, 1); }), "more than the 16"));
  EXPECT_TRUE(testing::contains(with([](MemoryTimeline& b) { b.meta.estimate["gpu"] = 1; }),
                                "no component"));
}

TEST(MemoryTimelineHostile, ReplayContradictionsAreRefused) {
  auto with = [&](auto change) {
    MemoryTimeline bad = sample_timeline();
    change(bad);
    return refusal(timeline_file(bad.events, timeline_meta_to_json(bad.meta)));
  };
  EXPECT_TRUE(
      testing::contains(with([](MemoryTimeline& b) { b.events[4].live = 7001; }),
                        "says 7001 bytes are live, but the events up to it add up to 7000"));
  EXPECT_TRUE(testing::contains(with([](MemoryTimeline& b) { b.events[7].bytes = 1500; }),
                                "has only 1000 bytes live from before the window"));
  EXPECT_TRUE(testing::contains(with([](MemoryTimeline& b) { b.events[5].address = 0x2000; }),
                                "no block is live"));
  EXPECT_TRUE(testing::contains(with([](MemoryTimeline& b) { b.events[3].address = 0x1000; }),
                                "which is live since event 0"));
  EXPECT_TRUE(testing::contains(with([](MemoryTimeline& b) { b.meta.window_peak_bytes = 16000; }),
                                "own peak over the window was 16000"));
  // Once the cap was reached the tracker's peak may lie past what was written.
  MemoryTimeline capped = sample_timeline();
  capped.meta.window_peak_bytes = 16000;
  capped.meta.cap_reached = true;
  EXPECT_EQ(replay_memory_timeline(capped, kWhat).peak_bytes, 15000);
}

TEST(MemoryTimelineHostile, RepeatedKeysDeepJsonAndWrongTypesAreRefused) {
  const MemoryTimeline t = sample_timeline();
  std::string meta = timeline_meta_to_json(t.meta);
  const std::string repeated = "{\"run_id\":\"a\"," + meta.substr(1);
  EXPECT_TRUE(testing::contains(refusal(timeline_file(t.events, repeated)),
                                "key 'run_id' appears twice"));
  const std::string deep = std::string(100, '[') + std::string(100, ']');
  EXPECT_TRUE(testing::contains(refusal(timeline_file(t.events, deep)), kWhat));
  std::string wrong = meta;
  wrong.replace(wrong.find("\"cap_reached\":false"), 19, "\"cap_reached\":1");
  EXPECT_TRUE(testing::contains(refusal(timeline_file(t.events, wrong)), "cap_reached"));
  std::string unknown = "{\"surprise\":1," + meta.substr(1);
  EXPECT_TRUE(testing::contains(refusal(timeline_file(t.events, unknown)), "surprise"));
}

TEST(MemoryTimelineHostile, AFileThatIsNotARegularFileIsRefusedByName) {
  testing::TempDir dir("gradscope-timeline");
  const Error missing =
      testing::expect_usage_error([&] { read_memory_timeline(dir.file("none.gsmt")); });
  EXPECT_TRUE(testing::contains(missing.what(), dir.file("none.gsmt")));
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  const Error fifo = testing::expect_usage_error([&] { read_memory_timeline(dir.file("fifo")); });
  EXPECT_TRUE(testing::contains(fifo.what(), dir.file("fifo")));
  write(dir.file("cut.gsmt"), testing::sample_timeline_file().substr(0, 50));
  const Error cut =
      testing::expect_usage_error([&] { read_memory_timeline(dir.file("cut.gsmt")); });
  EXPECT_TRUE(testing::contains(cut.what(), dir.file("cut.gsmt")));
  EXPECT_TRUE(testing::contains(cut.what(), "cut short"));
}

}  // namespace
}  // namespace memory_timeline_test
}  // namespace gradscope
