// A results database from elsewhere cannot change what gradscope writes: triggers, and
// gradscope's tables defined otherwise, are refused before anything is written; the user's own
// views and indexes are fine, and an older database is still opened (and given the tables it
// lacks).
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <string>
#include <vector>

#include "gradscope/core/error.h"
#include "gradscope/store/db.h"
#include "test_util.h"

namespace gradscope {
namespace {

void run_sql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* message = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &message);
  EXPECT_EQ(rc, SQLITE_OK) << (message ? message : "");
  sqlite3_free(message);
  sqlite3_close(db);
}

std::string one_value(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  std::string value;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK &&
      sqlite3_step(stmt) == SQLITE_ROW && sqlite3_column_text(stmt, 0) != nullptr)
    value = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return value;
}

// A gradscope database holding one run, then `sql` run on it by someone else.
std::string database_with(const testing::TempDir& dir, const std::string& name,
                          const std::string& sql) {
  const std::string path = dir.file(name);
  {
    Database db(path);
    db.write_run(testing::result_record("run-one"));
  }
  run_sql(path, sql);
  return path;
}

TEST(DbSchemaGuard, TriggersAreRefusedByNameBeforeAnythingIsWritten) {
  testing::TempDir dir("gradscope-db-guard");
  const std::string deleting = database_with(
      dir, "delete.db",
      "CREATE TRIGGER vanish AFTER INSERT ON runs BEGIN DELETE FROM runs WHERE attempt_id = "
      "NEW.attempt_id; END;");
  const std::string forging = database_with(
      dir, "forge.db",
      "CREATE TRIGGER forge AFTER INSERT ON runs BEGIN UPDATE runs SET final_loss = 0.001 "
      "WHERE attempt_id = NEW.attempt_id; END; CREATE TRIGGER quiet BEFORE INSERT ON meta "
      "BEGIN SELECT 1; END;");
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {deleting, {"'vanish' on 'runs'"}}, {forging, {"'forge' on 'runs'", "'quiet' on 'meta'"}}};
  for (const auto& [path, names] : cases) {
    for (const DatabaseAccess access : {DatabaseAccess::kReadWrite, DatabaseAccess::kReadOnly}) {
      const Error e = testing::expect_usage_error([&] { Database db(path, access); });
      EXPECT_TRUE(testing::contains(e.what(), "trigger")) << e.what();
      for (const std::string& name : names)
        EXPECT_TRUE(testing::contains(e.what(), name)) << e.what();
    }
    EXPECT_EQ(one_value(path, "SELECT count(*) FROM runs"), "1");
    EXPECT_EQ(one_value(path, "SELECT final_loss FROM runs"), "2.5");
  }
}

// A gradscope database whose runs table is `CREATE TABLE name(...)` with `run_id` written as
// `run_id_column` and `tail` after the columns, as someone else could make it.
std::string runs_table_as(const testing::TempDir& dir, const std::string& file,
                          const std::string& name, const std::string& run_id_column,
                          const std::string& tail) {
  const std::string path = dir.file(file);
  run_sql(path, "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT); INSERT INTO meta VALUES "
                "('schema_version', '1'), ('application', 'gradscope'); CREATE TABLE " +
                    name + "(attempt_id INTEGER PRIMARY KEY, " + run_id_column +
                    ", sweep TEXT, status TEXT, started_at TEXT, finished_at TEXT, config_json "
                    "TEXT, record_json TEXT, model TEXT, preset TEXT, optimizer TEXT, strategy "
                    "TEXT, params INTEGER, final_loss REAL, final_val_loss REAL, total_s REAL, "
                    "step_median_s REAL, samples_per_s REAL, tokens_per_s REAL, peak_bytes "
                    "INTEGER, peak_rss_bytes INTEGER, optimizer_state_bytes INTEGER" +
                    tail + ");");
  return path;
}

TEST(DbSchemaGuard, GradscopesTablesDefinedOtherwiseAreRefused) {
  testing::TempDir dir("gradscope-db-guard");
  const std::string contention_columns =
      ", disturbed INTEGER, involuntary_switches_per_s REAL, steal_pct REAL, "
      "competing_tasks_mean REAL";
  const std::vector<std::pair<std::string, std::string>> cases = {
      // A unique run id that replaces on conflict: a new attempt of a run would delete the
      // old (a table of the previous schema otherwise).
      {runs_table_as(dir, "replace.db", "runs", "run_id TEXT UNIQUE ON CONFLICT REPLACE", ""),
       "'runs'"},
      // A table constraint of someone else's beside gradscope's columns.
      {runs_table_as(dir, "constrained.db", "runs", "run_id TEXT",
                     contention_columns + ", UNIQUE(run_id) ON CONFLICT REPLACE"),
       "'runs'"},
      // The first under another spelling of the name: SQLite's names ignore case, so "Runs" is
      // the table gradscope writes to.
      {runs_table_as(dir, "cased.db", "Runs", "run_id TEXT UNIQUE ON CONFLICT REPLACE", ""),
       "'Runs'"}};
  for (const auto& [path, name] : cases) {
    const Error e = testing::expect_usage_error([&] { Database db(path); });
    EXPECT_TRUE(testing::contains(e.what(), name + " is not defined as gradscope defines it"))
        << e.what();
  }
  // A view where a table of gradscope's belongs.
  const std::string view = database_with(dir, "view.db",
                                         "DROP TABLE samples; CREATE VIEW samples AS SELECT "
                                         "attempt_id, 0 AS sample FROM runs;");
  const Error e = testing::expect_usage_error([&] { Database db(view); });
  EXPECT_TRUE(testing::contains(e.what(), "view named 'samples'")) << e.what();
}

TEST(DbSchemaGuard, UsersViewsAndIndexesAndOlderDatabasesAreKept) {
  testing::TempDir dir("gradscope-db-guard");
  const std::string own = database_with(
      dir, "own.db",
      "CREATE VIEW good_runs AS SELECT run_id, final_loss FROM runs WHERE status = 'ok'; "
      "CREATE INDEX by_loss ON runs(final_loss); CREATE TABLE notes(run_id TEXT, note TEXT);");
  {
    Database db(own);
    db.write_run(testing::result_record("run-two"));
    EXPECT_EQ(db.count_runs(), 2);
  }
  EXPECT_EQ(one_value(own, "SELECT count(*) FROM good_runs"), "2");
  { Database read(own, DatabaseAccess::kReadOnly); }
  // A database of the first schema, before the samples and probes tables and the runs'
  // contention columns, as gradscope wrote it: opened, and what it lacks added.
  const std::string older = dir.file("older.db");
  run_sql(older,
          "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT); INSERT INTO meta VALUES "
          "('schema_version', '1'), ('application', 'gradscope');\n"
          "CREATE TABLE IF NOT EXISTS runs(\n  attempt_id INTEGER PRIMARY KEY,\n  run_id TEXT, "
          "sweep TEXT, status TEXT, started_at TEXT, finished_at TEXT,\n  config_json TEXT, "
          "record_json TEXT,\n  model TEXT, preset TEXT, optimizer TEXT, strategy TEXT,\n  "
          "params INTEGER, final_loss REAL, final_val_loss REAL,\n  total_s REAL, step_median_s "
          "REAL, samples_per_s REAL, tokens_per_s REAL,\n  peak_bytes INTEGER, peak_rss_bytes "
          "INTEGER, optimizer_state_bytes INTEGER);\n"
          "CREATE INDEX IF NOT EXISTS runs_run_id ON runs(run_id);\n"
          "CREATE INDEX IF NOT EXISTS runs_sweep ON runs(sweep);\n"
          "CREATE TABLE IF NOT EXISTS steps(\n  attempt_id INTEGER, step INTEGER, loss REAL, lr "
          "REAL, grad_norm REAL, time_s REAL,\n  samples INTEGER, tokens INTEGER, targets "
          "INTEGER,\n  PRIMARY KEY(attempt_id, step));\n"
          "CREATE TABLE IF NOT EXISTS evals(\n  attempt_id INTEGER, step INTEGER, val_loss REAL, "
          "accuracy REAL,\n  PRIMARY KEY(attempt_id, step));");
  { Database read(older, DatabaseAccess::kReadOnly); }
  {
    Database db(older);
    db.write_run(testing::result_record("run-two"));
  }
  EXPECT_EQ(one_value(older, "SELECT count(*) FROM sqlite_master WHERE name = 'samples'"), "1");
  EXPECT_EQ(one_value(older, "SELECT count(*) FROM pragma_table_info('runs') WHERE name IN "
                             "('disturbed', 'steal_pct')"),
            "2");
  // Its columns added at the end of the table, it opens again both ways.
  { Database read(older, DatabaseAccess::kReadOnly); }
  {
    Database db(older);
    EXPECT_EQ(db.count_runs(), 1);
  }
}

}  // namespace
}  // namespace gradscope
