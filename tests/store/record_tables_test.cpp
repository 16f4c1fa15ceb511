// The database's record tables (store/record_tables.h) against the record: a record with every
// field set is stored and read back as it was, every column holds a field the record writes,
// and what each column stores is that field's value.
#include "gradscope/store/record_tables.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gradscope/store/db.h"
#include "record_keys.h"
#include "record_sample.h"
#include "test_util.h"

namespace gradscope {
namespace {

using nlohmann::json;

// Every row of `sql` with its columns as SQLite stored them (integer, real, text or null).
std::vector<json> stored_rows(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK)
      << sqlite3_errmsg(db);
  std::vector<json> rows;
  while (sqlite3_step(stmt) == SQLITE_ROW) {
    json row = json::object();
    for (int c = 0; c < sqlite3_column_count(stmt); ++c) {
      json& v = row[sqlite3_column_name(stmt, c)];
      switch (sqlite3_column_type(stmt, c)) {
        case SQLITE_INTEGER:
          v = sqlite3_column_int64(stmt, c);
          break;
        case SQLITE_FLOAT:
          v = sqlite3_column_double(stmt, c);
          break;
        case SQLITE_NULL:
          v = nullptr;
          break;
        default:
          v = std::string(reinterpret_cast<const char*>(sqlite3_column_text(stmt, c)));
      }
    }
    rows.push_back(std::move(row));
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return rows;
}

// A value of the record's JSON as a column stores it: true and false as 1 and 0, an object
// as its text.
json as_stored(const json& v) {
  if (v.is_boolean()) return v.get<bool>() ? 1 : 0;
  if (v.is_structured()) return v.dump();
  return v;
}

// The fields the columns of `table` hold that the record's JSON lacks, as "column (field)".
std::vector<std::string> unmapped_columns(const RecordTable& table, const json& record) {
  const std::vector<std::string> paths = testing::key_paths(record);
  const std::string prefix = table.entries ? std::string(table.entries) + "[]." : "";
  std::vector<std::string> out;
  for (const RecordColumn& c : table.columns) {
    if (c.field == nullptr || std::string(c.field).empty()) continue;  // position, whole record
    if (std::find(paths.begin(), paths.end(), prefix + c.field) == paths.end())
      out.push_back(std::string(c.name) + " (" + prefix + c.field + ")");
  }
  return out;
}

TEST(RecordTables, EveryColumnHoldsAFieldOfTheRecord) {
  const json record = record_to_json(testing::full_record());
  for (const RecordTable& table : record_tables())
    EXPECT_EQ(unmapped_columns(table, record), std::vector<std::string>{}) << table.name;
}

// The check above names a column whose field the record does not write.
TEST(RecordTables, AColumnOfAFieldTheRecordLacksIsNamed) {
  json record = record_to_json(testing::full_record());
  record["memory"].erase("peak_rss_bytes");
  record["timeline"][0].erase("power_w");
  EXPECT_EQ(unmapped_columns(record_table("runs"), record),
            std::vector<std::string>{"peak_rss_bytes (memory.peak_rss_bytes)"});
  EXPECT_EQ(unmapped_columns(record_table("samples"), record),
            std::vector<std::string>{"power_w (timeline[].power_w)"});
}

TEST(RecordTables, AFullRecordIsStoredFieldByFieldAndReadBackWhole) {
  testing::TempDir dir("gradscope-record-tables");
  const std::string path = dir.file("runs.db");
  const RunRecord record = testing::full_record();
  const json j = record_to_json(record);
  int64_t attempt = 0;
  {
    Database db(path);
    attempt = db.write_run(record);
    const std::vector<RunRecord> back = db.records();
    ASSERT_EQ(back.size(), 1u);
    EXPECT_EQ(record_to_json(back[0]), j);
  }
  const std::vector<json> runs = stored_rows(path, "SELECT * FROM runs");
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0]["attempt_id"], attempt);
  EXPECT_EQ(runs[0]["record_json"], j.dump());
  for (const RecordColumn& c : record_table("runs").columns) {
    if (std::string(c.field).empty()) continue;
    const json field = j.at(json::json_pointer("/" + testing::pointer_path(c.field)));
    EXPECT_EQ(runs[0][c.name], as_stored(field)) << c.name;
  }
  for (const RecordTable& table : record_tables()) {
    if (table.entries == nullptr) continue;
    const std::vector<json> rows = stored_rows(
        path, std::string("SELECT * FROM ") + table.name + " ORDER BY " + table.key);
    const json& entries = j.at(table.entries);
    ASSERT_EQ(rows.size(), entries.size()) << table.name;
    for (size_t n = 0; n < rows.size(); ++n)
      for (const RecordColumn& c : table.columns) {
        const json expected =
            c.field ? as_stored(entries[n].at(c.field)) : json(static_cast<int64_t>(n));
        EXPECT_EQ(rows[n][c.name], expected) << table.name << "." << c.name;
      }
  }
}

}  // namespace
}  // namespace gradscope
