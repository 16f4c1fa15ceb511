// A database holding a record this version cannot read still gives its report: the record is
// left out and named, never silently dropped and never a reason to fail the whole report.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include "gradscope/core/record.h"
#include "gradscope/report/analysis.h"
#include "gradscope/report/tables.h"
#include "gradscope/store/db.h"
#include "test_util.h"

namespace gradscope {
namespace {

TEST(ReportUnreadable, ARecordThatCannotBeReadIsLeftOutAndNamed) {
  testing::TempDir dir;
  const std::string path = dir.file("r.db");
  Database db(path);
  RunRecord ok;
  ok.run_id = "good";
  ok.config.model = "llama";
  ok.steps.push_back(StepEntry{1, 2.5, 1e-3, 1.0, 0.1, 4, 128, 128, 1, false});
  db.write_run(ok);
  // What an older version stored for a run it refused: a dtype this version does not know.
  nlohmann::json refused = record_to_json(ok);
  refused["run_id"] = "refused";
  refused["status"] = "error";
  refused["config"]["dtype"] = "fp16";
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
  const std::string sql =
      "INSERT INTO runs(run_id, status, record_json) VALUES ('refused', "
      "'error', '" +
      refused.dump() + "')";
  ASSERT_EQ(sqlite3_exec(raw, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(raw);

  const ReportData data = analyze(db, ReportOptions{});
  EXPECT_EQ(data.runs.size(), 1u);
  EXPECT_EQ(data.attempts, 2);
  ASSERT_EQ(data.unreadable.size(), 1u);
  EXPECT_NE(data.unreadable[0].find("attempt 2"), std::string::npos) << data.unreadable[0];
  const std::string line = provenance(data);
  EXPECT_NE(line.find("1 attempt(s) left out"), std::string::npos) << line;
  EXPECT_NE(line.find("config.dtype"), std::string::npos) << line;
}

}  // namespace
}  // namespace gradscope
