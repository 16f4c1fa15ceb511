// The report's memory timeline section: the points drawn keep the peak, the section shows the
// numbers the file holds and names the components where the estimate differs, names from the
// file stay text, `report --memory-timeline` refuses what it cannot show, and headless
// Chromium renders the section with its script run.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "gradscope/core/record.h"
#include "gradscope/report/analysis.h"
#include "gradscope/report/html.h"
#include "gradscope/report/timeline.h"
#include "gradscope/store/db.h"
#include "test_util.h"
#include "timeline_sample.h"

namespace gradscope {
namespace timeline_report_test {
namespace {

namespace fs = std::filesystem;

ReportTimeline sample(const std::string& run_id = "sample-run") {
  ReportTimeline r;
  r.path = "/data/window.gsmt";
  r.timeline = testing::sample_timeline(run_id);
  r.replay = replay_memory_timeline(r.timeline, r.path);
  return r;
}

bool on_path(const std::string& name) {
  return std::system(("command -v " + name + " >/dev/null 2>&1").c_str()) == 0;
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// The text between `open` (from its first occurrence after `from`) and the next `close`.
std::string between(const std::string& html, const std::string& open, const std::string& close,
                    size_t from = 0) {
  const size_t a = html.find(open, from);
  if (a == std::string::npos) return "";
  const size_t b = html.find(close, a + open.size());
  return html.substr(a + open.size(), b == std::string::npos ? std::string::npos
                                                             : b - a - open.size());
}

TEST(TimelinePoints, AShortWindowIsDrawnWholeAndALongOneKeepsItsPeak) {
  EXPECT_EQ(timeline_points({5, 7, 6}, 2000), (std::vector<int64_t>{0, 1, 2}));
  std::vector<int64_t> live(1'000'003);
  for (size_t i = 0; i < live.size(); ++i) live[i] = static_cast<int64_t>(i % 1000);
  live[777'777] = 5000;  // one spike, the peak
  live[888'888] = 5000;  // as high, later: the first is the peak
  const std::vector<int64_t> points = timeline_points(live, 2000);
  EXPECT_LE(points.size(), 2000u);
  EXPECT_GT(points.size(), 1000u);
  EXPECT_EQ(points.front(), 0);
  EXPECT_EQ(points.back(), static_cast<int64_t>(live.size()) - 1);
  EXPECT_TRUE(std::is_sorted(points.begin(), points.end()));
  EXPECT_TRUE(std::adjacent_find(points.begin(), points.end()) == points.end());
  EXPECT_NE(std::find(points.begin(), points.end(), 777'777), points.end());
  EXPECT_NE(std::find(points.begin(), points.end(), 888'888), points.end());
}

TEST(TimelineSection, ShowsThePeakTheLargestBlocksAndWhereTheEstimateDiffers) {
  EXPECT_EQ(timeline_section_html({}), "");
  const std::string h = timeline_section_html({sample()});
  EXPECT_TRUE(testing::contains(h, "<section id=\"memory-timeline\"><h2>Memory timeline</h2>"));
  EXPECT_TRUE(testing::contains(h, "data-peak-bytes=\"15000\""));
  EXPECT_TRUE(testing::contains(h, "peak 15000 bytes"));
  EXPECT_TRUE(testing::contains(h, "in step 1 optimizer (event 6)"));
  // The largest block first: the optimizer state, named by its tensor.
  const std::string first_row = between(h, "<tr data-bytes=", "</tr>");
  EXPECT_EQ(first_row.substr(0, 6), "\"8000\"");
  EXPECT_TRUE(testing::contains(first_row, "optimizer step")) << first_row;
  EXPECT_TRUE(testing::contains(first_row, "exp_avg")) << first_row;
  EXPECT_TRUE(testing::contains(first_row, "[2000]")) << first_row;
  // The estimate says 4000 bytes of gradients and 3000 of activations; the timeline holds 2000
  // and 0 at its peak: both differ by more than 1500 (10% of 15000), the others do not.
  EXPECT_TRUE(testing::contains(h, "<tr class=\"tl-differs\" data-component=\"gradients\">"));
  EXPECT_TRUE(testing::contains(h, "<tr class=\"tl-differs\" data-component=\"activations\">"));
  EXPECT_TRUE(testing::contains(h, "<tr class=\"\" data-component=\"parameters\">"));
  EXPECT_TRUE(testing::contains(h, "<tr class=\"\" data-component=\"other\">"));  // 1000 < 1500
  EXPECT_TRUE(testing::contains(h, "peak: <b>gradients, activations</b>"));
  EXPECT_FALSE(testing::contains(h, "tl-cap"));
}

TEST(TimelineSection, TheCapAndAMissingEstimateAreSaid) {
  ReportTimeline r = sample();
  r.timeline.meta.cap_reached = true;
  r.timeline.meta.dropped_events = 1234;
  r.timeline.meta.estimate.clear();
  const std::string h = timeline_section_html({r});
  EXPECT_TRUE(testing::contains(h, "<p class=\"tl-cap\"><b>The file's size cap (1048576 bytes"));
  EXPECT_TRUE(testing::contains(h, "1234 events after it were dropped"));
  EXPECT_TRUE(testing::contains(h, "no estimate to compare with"));
}

TEST(TimelineSection, TwoFilesShareTheByteScaleAndNamesFromTheFileStayText) {
  ReportTimeline small = sample("<script>alert(1)</script>");
  small.timeline.meta.labels[4].module = "x\" onmouseover=\"alert(2)";
  small.replay = replay_memory_timeline(small.timeline, small.path);
  ReportTimeline big = sample("big-run");
  for (TimelineEvent& e : big.timeline.events) {
    e.bytes *= 2;
    e.live *= 2;
  }
  big.timeline.meta.window_peak_bytes *= 2;
  big.replay = replay_memory_timeline(big.timeline, big.path);
  const std::string h = timeline_section_html({small, big});
  EXPECT_FALSE(testing::contains(h, "<script>alert(1)"));
  EXPECT_FALSE(testing::contains(h, "\" onmouseover="));
  EXPECT_TRUE(testing::contains(h, "&lt;script&gt;alert(1)&lt;/script&gt;"));
  EXPECT_TRUE(testing::contains(h, "data-run-id=\"big-run\""));
  // Both charts are drawn against the larger peak.
  const size_t second = h.find("data-run-id=\"big-run\"");
  EXPECT_EQ(between(h, "data-ymax=\"", "\""), "30000");
  EXPECT_EQ(between(h, "data-ymax=\"", "\"", second), "30000");
}

// A report folder's database with one run, for the command line.
std::string one_run_database(const testing::TempDir& dir) {
  const std::string path = dir.file("runs.db");
  Database db(path);
  RunRecord run;
  run.run_id = "good";
  run.config.model = "llama";
  run.steps.push_back(StepEntry{1, 2.5, 1e-3, 1.0, 0.1, 4, 128, 128, 1, false});
  db.write_run(run);
  return path;
}

TEST(TimelineReportCommand, RefusesWhatItCannotShowAndDrawsWhatItCan) {
  testing::TempDir dir("gradscope-timeline-report");
  const std::string db = one_run_database(dir);
  write(dir.file("a.gsmt"), testing::sample_timeline_file());
  write(dir.file("cut.gsmt"), testing::sample_timeline_file().substr(0, 100));
  const std::string a = " --memory-timeline " + dir.file("a.gsmt");
  auto r = testing::run_gradscope("report " + db + " --out " + dir.file("o1") + a + a + a);
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(testing::contains(r.err, "at most 2")) << r.err;
  r = testing::run_gradscope("report " + db + " --format md" + a);
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(testing::contains(r.err, "not in --format md")) << r.err;
  r = testing::run_gradscope("report " + db + " --out " + dir.file("o2") + a +
                             " --memory-timeline " + dir.file("cut.gsmt"));
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(testing::contains(r.err, dir.file("cut.gsmt") + ": it was cut short")) << r.err;
  EXPECT_FALSE(fs::exists(dir.file("o2") + "/report.html"));
  if (!on_path("gnuplot")) GTEST_SKIP() << "gnuplot not installed";
  r = testing::run_gradscope("report " + db + " --out " + dir.file("o3") + a);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string html = testing::slurp(dir.file("o3") + "/report.html");
  EXPECT_TRUE(testing::contains(html, "<section id=\"memory-timeline\">"));
  EXPECT_TRUE(testing::contains(html, "data-peak-bytes=\"15000\""));
}

// The page rendered by headless Chromium, its DOM read back after the script ran.
TEST(TimelineReportChromium, TheRenderedPageHoldsTheSeriesThePeakAndTheLargestBlock) {
  std::string chromium;
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"})
    if (chromium.empty() && on_path(name)) chromium = name;
  if (chromium.empty()) GTEST_SKIP() << "no chromium to render the report with";
  testing::TempDir dir("gradscope-timeline-chromium");
  ReportData data;
  data.timelines = {sample()};
  write(dir.file("report.html"), report_html(data, {}, dir.path()));
  const std::string dom = dir.file("dom.html");
  const std::string cmd = chromium +
                          " --headless --no-sandbox --disable-gpu --virtual-time-budget=5000 "
                          "--dump-dom file://" +
                          fs::absolute(dir.file("report.html")).string() + " >" + dom +
                          " 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const std::string rendered = testing::slurp(dom);
  // The script ran over the one figure: it set the zoom and drew the x ticks.
  EXPECT_TRUE(testing::contains(rendered, "data-timelines-drawn=\"1\""));
  EXPECT_TRUE(testing::contains(rendered, "data-x0=\"-0.5\" data-x1=\"8.5\""));
  EXPECT_TRUE(testing::contains(rendered, "<text class=\"tl-xtick\""));
  // The series: one band per component with bytes, each holding its values at every point.
  const std::regex band(
      "class=\"tl-band\"[^>]*data-component=\"([a-z ]+)\" data-values=\"([0-9 ]+)\"");
  std::map<std::string, std::string> bands;
  for (auto it = std::sregex_iterator(rendered.begin(), rendered.end(), band);
       it != std::sregex_iterator(); ++it)
    bands[(*it)[1]] = (*it)[2];
  EXPECT_EQ(bands.size(), 5u);
  EXPECT_EQ(bands["optimizer state"], "0 0 0 0 0 0 8000 8000 0");
  EXPECT_EQ(bands["gradients"], "0 0 0 2000 2000 2000 2000 2000 2000");
  // The peak marker and its label, and the largest block live then.
  EXPECT_TRUE(testing::contains(rendered, "data-peak-bytes=\"15000\" data-peak-event=\"6\""));
  EXPECT_TRUE(testing::contains(rendered, "peak 15000 bytes"));
  const std::string first_row = between(rendered, "<tr data-bytes=", "</tr>");
  EXPECT_EQ(first_row.substr(0, 6), "\"8000\"");
  EXPECT_TRUE(testing::contains(first_row, "<td>optimizer step</td>")) << first_row;
  EXPECT_TRUE(testing::contains(first_row, "8000 bytes")) << first_row;
}

}  // namespace
}  // namespace timeline_report_test
}  // namespace gradscope
