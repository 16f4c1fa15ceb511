// What a report says, computed from the results database alone: the runs grouped by
// configuration (seeds pooled, with 95% intervals; groups.h), the study's claims re-examined
// against the data (claims.h), and per model and memory budget the combination to use
// (recommendations.h). Rendering (tables, figures, HTML) is in render.h.
//
// Equal steps / equal samples: compared runs are all read at the smallest step count / sample
// count that every one of them reached.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gradscope/core/record.h"
#include "gradscope/report/claims.h"
#include "gradscope/report/format.h"
#include "gradscope/report/groups.h"
#include "gradscope/report/recommendations.h"
#include "gradscope/report/timeline.h"

namespace gradscope {

class Database;

struct ReportOptions {
  std::vector<int64_t> memory_budgets;  // --memory-budget, bytes
};

struct ReportData : GroupedRuns {
  std::string db_path;
  // Attempts whose record this version cannot read ("attempt 12: config.dtype is ..."), left
  // out of everything above and named in the report.
  std::vector<std::string> unreadable;
  std::vector<Finding> findings;  // study_claims(), in order
  std::vector<Recommendation> recommendations;
  // Memory timeline files (--memory-timeline), read and replayed; not from the database.
  std::vector<ReportTimeline> timelines;
};

// Reads the database and computes everything above; a record that cannot be read is left out
// and listed in `unreadable`. Throws a usage error for a database with no runs.
ReportData analyze(Database& db, const ReportOptions& options);
// The same from records, in attempt order (the latest attempt of each run_id wins; `attempts`
// = records.size()).
ReportData analyze_records(std::vector<RunRecord> records, const ReportOptions& options);

}  // namespace gradscope
