// The report's "Memory timeline" section (`gradscope report ... --memory-timeline FILE`): for
// each timeline file (core/memory_timeline.h) the live bytes through its window stacked by
// component, the peak marked, the phases shaded, the largest blocks live at the peak, and the
// estimate's breakdown at its predicted peak beside the timeline's at its own.
// A file's names (run id, modules, phases, tensor names) are data: they reach the page only
// through html_escape, and the page's one script reads them from data- attributes and text.
#pragma once

#include <string>
#include <vector>

#include "gradscope/core/memory_timeline.h"

namespace gradscope {

// A timeline file read back and replayed.
struct ReportTimeline {
  std::string path;  // as given on the command line
  MemoryTimeline timeline;
  TimelineReplay replay;
};

// At most this many files side by side in one report.
constexpr size_t kMaxReportTimelines = 2;
// At most this many points per drawn series, and phases shaded, per timeline.
constexpr size_t kTimelineMaxPoints = 2000;
constexpr size_t kTimelineMaxPhasesDrawn = 400;
// A component is named as differing when the estimate and the timeline at their peaks differ
// by more than this share of the timeline's peak.
constexpr double kTimelineDifferShare = 0.10;

// Reads and replays the file at `path` (a usage error naming it on anything amiss).
ReportTimeline load_report_timeline(const std::string& path);

// The events drawn of a window of `live.size()` events: all of them when there are at most
// max_points, else the first and the last, and in each of (max_points - 2) / 2 equal runs of
// events the one of the largest live total (the first where several tie) and the one of the
// smallest, in order. Every run's maximum is kept, so the peak (the first event of the
// largest total) is always drawn.
std::vector<int64_t> timeline_points(const std::vector<int64_t>& live, size_t max_points);

// The section, one figure per timeline (one above the other, on the same byte scale); "" for
// none.
std::string timeline_section_html(const std::vector<ReportTimeline>& timelines);

// The section's styles and its script, for the page's one <style> and one <script>.
const char* timeline_css();
const char* timeline_script();

}  // namespace gradscope
