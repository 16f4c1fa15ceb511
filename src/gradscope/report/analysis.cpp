#include "gradscope/report/analysis.h"

#include <utility>

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
  ReportData data = analyze_records(db.records(&unreadable), options);
  data.db_path = db.path();
  data.unreadable = std::move(unreadable);
  data.attempts += static_cast<int64_t>(data.unreadable.size());
  return data;
}

}  // namespace gradscope
