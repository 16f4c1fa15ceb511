#include "gradscope/report/analysis.h"

#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gradscope/core/error.h"
#include "gradscope/store/db.h"

namespace gradscope {

ReportData analyze_records(std::vector<RunRecord> records, const ReportOptions& options) {
  ReportData data;
  static_cast<GroupedRuns&>(data) = group_runs(std::move(records));
  data.findings = evaluate_claims(data);
  data.recommendations = recommend(data, options.memory_budgets);
  return data;
}

ReportData analyze(Database& db, const ReportOptions& options) {
  std::vector<std::string> unreadable;
  std::vector<RunRecord> records = db.records(&unreadable);
  if (records.empty() && !unreadable.empty()) {
    std::string first;
    for (size_t i = 0; i < unreadable.size() && i < 3; ++i)
      first += (first.empty() ? "" : "; ") + unreadable[i];
    fail_usage(fmt::format("the database {} holds {} attempt(s), none of them a readable run "
                           "record: {}{}",
                           db.path(), unreadable.size(), first,
                           unreadable.size() > 3 ? "; ..." : ""),
               "the records were written by another program or changed by hand "
               "(docs/record.md says what a record holds)");
  }
  ReportData data = analyze_records(std::move(records), options);
  data.db_path = db.path();
  data.unreadable = std::move(unreadable);
  data.attempts += static_cast<int64_t>(data.unreadable.size());
  return data;
}

}  // namespace gradscope
