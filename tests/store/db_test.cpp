#include "gradscope/store/db.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "gradscope/core/error.h"
#include "gradscope/core/record.h"
#include "test_util.h"

namespace gradscope {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A fresh directory per test, removed afterwards.
class DbTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "gradscope-db-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, ec);
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Runs one SQL statement with the plain C API and returns its rows as text ("NULL" for
// SQL NULL), so the tests check the file itself, not Database's own readers.
std::vector<std::vector<std::string>> query(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK)
      << sqlite3_errmsg(db);
  std::vector<std::vector<std::string>> rows;
  while (sqlite3_step(stmt) == SQLITE_ROW) {
    std::vector<std::string> row;
    for (int c = 0; c < sqlite3_column_count(stmt); ++c) {
      const auto* text = sqlite3_column_text(stmt, c);
      row.push_back(text == nullptr ? "NULL" : reinterpret_cast<const char*>(text));
    }
    rows.push_back(std::move(row));
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return rows;
}

void exec_raw(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* message = nullptr;
  ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &message), SQLITE_OK)
      << (message ? message : "");
  sqlite3_close(db);
}

// A record as a file holds it; load() reads it as the database's writers get it.
json sample_record(const std::string& run_id = "abc123") {
  return json{
      {"schema", "gradscope.run/1"},
      {"run_id", run_id},
      {"config",
       {{"model", "llama"},
        {"preset", "tiny"},
        {"optimizer", "adam"},
        {"strategy", "standard"},
        {"lr", 1e-3}}},
      {"status", "ok"},
      {"failure", nullptr},
      {"params", 123456},
      {"steps", json::array({{{"step", 0},
                              {"loss", 5.5},
                              {"lr", 1e-3},
                              {"grad_norm", 2.0},
                              {"time_s", 0.25},
                              {"samples", 8},
                              {"tokens", 512},
                              {"targets", 504}},
                             {{"step", 1},
                              {"loss", 5.0},
                              {"lr", 1e-3},
                              {"grad_norm", nullptr},
                              {"time_s", 0.2},
                              {"samples", 8},
                              {"tokens", 512},
                              {"targets", 504}}})},
      {"eval", json::array({{{"step", 1}, {"val_loss", 5.1}, {"accuracy", nullptr}}})},
      {"final_loss", 5.0},
      {"time", {{"total_s", 1.5}, {"step_median_s", 0.225}, {"data_s", nullptr}}},
      {"throughput", {{"samples_per_s", 32.0}, {"tokens_per_s", nullptr}}},
      {"memory",
       {{"peak_bytes", 4096}, {"peak_rss_bytes", nullptr}, {"optimizer_state_bytes", 987654}}},
  };
}

// The record of `j`, with the sweep and times the database stores beside it.
RunRecord load(const json& j, const std::string& sweep = "", const std::string& started_at = "",
               const std::string& finished_at = "") {
  RunRecord r = record_from_json(j);
  if (!sweep.empty()) r.sweep = sweep;
  r.started_at = started_at;
  r.finished_at = finished_at;
  return r;
}

void expect_usage_error(const std::string& path, const std::string& fragment) {
  try {
    Database db(path);
    FAIL() << "expected a usage error for " << path;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_FALSE(e.hint().empty());
  }
}

TEST_F(DbTest, CreatesSchemaMetaAndWal) {
  const std::string p = path("new.db");
  { Database db(p); }
  EXPECT_EQ(query(p, "SELECT value FROM meta WHERE key = 'schema_version'"),
            (std::vector<std::vector<std::string>>{{"1"}}));
  EXPECT_EQ(query(p, "SELECT value FROM meta WHERE key = 'application'"),
            (std::vector<std::vector<std::string>>{{"gradscope"}}));
  EXPECT_EQ(query(p, "PRAGMA journal_mode"), (std::vector<std::vector<std::string>>{{"wal"}}));
  EXPECT_EQ(query(p,
                  "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND "
                  "name = 'runs_run_id'")[0][0],
            "1");
}

TEST_F(DbTest, RoundTripsARecord) {
  const std::string p = path("runs.db");
  Database db(p);
  const json record = sample_record();
  const RunRecord loaded = load(record, "smoke", "2024-01-02T03:04:05Z", "2024-01-02T03:05:00Z");
  const int64_t id = db.write_run(loaded);
  EXPECT_EQ(db.count_runs(), 1);

  const auto runs =
      query(p,
            "SELECT attempt_id, run_id, sweep, status, started_at, finished_at, model, preset, "
            "optimizer, strategy, params, final_loss, final_val_loss, total_s, step_median_s, "
            "samples_per_s, tokens_per_s, peak_bytes, peak_rss_bytes, optimizer_state_bytes, "
            "typeof(params), typeof(final_loss), typeof(peak_rss_bytes) FROM runs");
  ASSERT_EQ(runs.size(), 1u);
  const std::vector<std::string> expected = {std::to_string(id),
                                             "abc123",
                                             "smoke",
                                             "ok",
                                             "2024-01-02T03:04:05Z",
                                             "2024-01-02T03:05:00Z",
                                             "llama",
                                             "tiny",
                                             "adam",
                                             "standard",
                                             "123456",
                                             "5.0",
                                             "5.1",
                                             "1.5",
                                             "0.225",
                                             "32.0",
                                             "NULL",
                                             "4096",
                                             "NULL",
                                             "987654",
                                             "integer",
                                             "real",
                                             "null"};
  EXPECT_EQ(runs[0], expected);
  EXPECT_EQ(json::parse(query(p, "SELECT config_json FROM runs")[0][0]),
            record_to_json(loaded)["config"]);

  const auto steps = query(p,
                           "SELECT step, loss, lr, grad_norm, time_s, samples, tokens, targets "
                           "FROM steps WHERE attempt_id = " +
                               std::to_string(id) + " ORDER BY step");
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0],
            (std::vector<std::string>{"0", "5.5", "0.001", "2.0", "0.25", "8", "512", "504"}));
  EXPECT_EQ(steps[1][3], "NULL");
  EXPECT_EQ(query(p, "SELECT step, val_loss, accuracy FROM evals"),
            (std::vector<std::vector<std::string>>{{"1", "5.1", "NULL"}}));

  // The readers give back what was written.
  const auto records = db.records();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(record_to_json(records[0]), record_to_json(loaded));
  const auto step_rows = db.steps_of(id);
  ASSERT_EQ(step_rows.size(), 2u);
  EXPECT_EQ(step_rows[0], record["steps"][0]);
  EXPECT_EQ(step_rows[1], record["steps"][1]);
  EXPECT_TRUE(step_rows[1]["grad_norm"].is_null());
  EXPECT_EQ(db.evals_of(id), record["eval"].get<std::vector<json>>());
  EXPECT_TRUE(db.steps_of(id + 1).empty());
}

TEST_F(DbTest, TimelineBecomesSampleRowsWithNullsKept) {
  const std::string p = path("runs.db");
  Database db(p);
  json record = sample_record();
  record["timeline"] = json::array({{{"t_s", 0.0},
                                     {"allocated_bytes", 100},
                                     {"util_pct", 50.0},
                                     {"cpu_util_pct", 50.0},
                                     {"rss_bytes", 4096},
                                     {"gpu_util_pct", nullptr},
                                     {"gpu_memory_used_bytes", nullptr},
                                     {"power_w", nullptr},
                                     {"sm_clock_mhz", nullptr},
                                     {"energy_j", 0.0}},
                                    {{"t_s", 0.1},
                                     {"allocated_bytes", 300},
                                     {"util_pct", 98.5},
                                     {"cpu_util_pct", 98.5},
                                     {"rss_bytes", 8192},
                                     {"gpu_util_pct", nullptr},
                                     {"gpu_memory_used_bytes", nullptr},
                                     {"power_w", nullptr},
                                     {"sm_clock_mhz", nullptr},
                                     {"energy_j", 1.5}}});
  const int64_t id = db.write_run(load(record));
  EXPECT_EQ(query(p,
                  "SELECT sample, allocated_bytes, gpu_util_pct, energy_j FROM samples "
                  "ORDER BY sample"),
            (std::vector<std::vector<std::string>>{{"0", "100", "NULL", "0.0"},
                                                   {"1", "300", "NULL", "1.5"}}));
  const auto rows = db.samples_of(id);
  ASSERT_EQ(rows.size(), 2u);
  for (size_t i = 0; i < rows.size(); ++i) {
    json expected = record["timeline"][i];
    expected["sample"] = static_cast<int64_t>(i);
    EXPECT_EQ(rows[i], expected) << i;
  }
  // A timeline entry of the wrong type is refused like any other field.
  record["timeline"][1]["allocated_bytes"] = "lots";
  EXPECT_THROW(db.write_run(load(record)), Error);
  EXPECT_EQ(db.count_runs(), 1);
}

TEST_F(DbTest, MissingFieldsAndEmptyArgumentsAreNull) {
  const std::string p = path("sparse.db");
  Database db(p);
  // A record with nothing measured (what the sweep stores for a crashed run): its
  // configuration is always there; everything unmeasured is NULL.
  RunRecord record;
  record.run_id = "r";
  record.status = RunStatus::kCrashed;
  db.write_run(record);
  EXPECT_EQ(query(p,
                  "SELECT sweep, started_at, finished_at, params, final_loss, final_val_loss, "
                  "total_s, peak_bytes, peak_rss_bytes FROM runs"),
            (std::vector<std::vector<std::string>>{
                {"NULL", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL"}}));
  EXPECT_EQ(query(p, "SELECT count(*) FROM steps")[0][0], "0");
}

TEST_F(DbTest, FinalValLossPrefersTheRecordsOwnField) {
  const std::string p = path("val.db");
  Database db(p);
  json record = sample_record();
  record["final_val_loss"] = 4.25;
  db.write_run(load(record));
  EXPECT_EQ(query(p, "SELECT final_val_loss FROM runs")[0][0], "4.25");
}

TEST_F(DbTest, ReopeningAppends) {
  const std::string p = path("append.db");
  int64_t first = 0;
  {
    Database db(p);
    first = db.write_run(load(sample_record("one"), "s"));
  }
  Database db(p);
  const int64_t second = db.write_run(load(sample_record("two"), "s"));
  EXPECT_GT(second, first);
  EXPECT_EQ(db.count_runs(), 2);
  const auto records = db.records();
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].run_id, "one");
  EXPECT_EQ(records[1].run_id, "two");
  EXPECT_EQ(query(p, "SELECT count(*) FROM steps")[0][0], "4");
}

TEST_F(DbTest, FailedWriteLeavesNoPartialRows) {
  const std::string p = path("atomic.db");
  Database db(p);
  db.write_run(load(sample_record("good")));
  // Step 0 twice violates PRIMARY KEY(attempt_id, step) half-way through the write (a record
  // read from JSON cannot have it: the reader refuses repeated steps).
  RunRecord bad = load(sample_record("bad"));
  bad.steps[1].step = bad.steps[0].step;
  try {
    db.write_run(bad);
    FAIL() << "expected the duplicate step to fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRuntime);
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("UNIQUE"), std::string::npos) << e.what();
  }
  EXPECT_EQ(db.count_runs(), 1);
  EXPECT_EQ(query(p, "SELECT count(*) FROM steps")[0][0], "2");
  EXPECT_EQ(query(p, "SELECT count(*) FROM evals")[0][0], "1");
  // The database stays usable after the rollback.
  db.write_run(load(sample_record("after")));
  EXPECT_EQ(db.count_runs(), 2);
}

TEST_F(DbTest, WrongTypesAreRefusedWithoutPartialRows) {
  const std::string p = path("types.db");
  Database db(p);
  json bad = sample_record();
  bad["eval"][0]["val_loss"] = "low";
  try {
    db.write_run(load(bad));
    FAIL() << "expected a type error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("eval[0].val_loss"), std::string::npos) << e.what();
  }
  json no_step = sample_record();
  no_step["steps"][0].erase("step");
  EXPECT_THROW(db.write_run(load(no_step)), Error);
  EXPECT_THROW(db.write_run(load(json::array())), Error);
  EXPECT_EQ(db.count_runs(), 0);
  EXPECT_EQ(query(p, "SELECT count(*) FROM steps")[0][0], "0");
}

TEST_F(DbTest, RefusesAFileThatIsNotADatabase) {
  const std::string p = path("notes.txt");
  {
    std::ofstream out(p, std::ios::binary);
    out << "these are my notes, not a database\n";
  }
  const std::string before = read_file(p);
  expect_usage_error(p, "not an SQLite database");
  EXPECT_EQ(read_file(p), before);
  EXPECT_FALSE(fs::exists(p + "-wal"));
}

TEST_F(DbTest, RefusesAForeignSqliteDatabaseAndLeavesItUntouched) {
  const std::string p = path("foreign.db");
  exec_raw(p, "CREATE TABLE foo(x INTEGER); INSERT INTO foo VALUES (42);");
  const std::string before = read_file(p);
  expect_usage_error(p, "did not create");
  EXPECT_EQ(read_file(p), before);
  EXPECT_EQ(query(p, "SELECT name FROM sqlite_master"),
            (std::vector<std::vector<std::string>>{{"foo"}}));

  // A `meta` table of someone else's is not enough either.
  const std::string q = path("foreign-meta.db");
  exec_raw(q,
           "CREATE TABLE meta(key TEXT, value TEXT); INSERT INTO meta VALUES "
           "('application', 'other'), ('schema_version', '1');");
  const std::string before_q = read_file(q);
  expect_usage_error(q, "did not create");
  EXPECT_EQ(read_file(q), before_q);
}

TEST_F(DbTest, RefusesANewerSchemaVersion) {
  const std::string p = path("future.db");
  { Database db(p); }
  exec_raw(p, "UPDATE meta SET value = '2' WHERE key = 'schema_version'");
  expect_usage_error(p, "schema version 2");
}

TEST_F(DbTest, RefusesAMissingDirectory) {
  expect_usage_error(path("no/such/dir/runs.db"), "does not exist");
  EXPECT_FALSE(fs::exists(path("no")));
}

TEST_F(DbTest, RefusesAnUnwritableDirectory) {
  // Permission bits do not stop root, so root gets a directory no one can create files in.
  std::string p;
  if (geteuid() == 0) {
    p = "/proc/gradscope-test.db";
  } else {
    fs::create_directory(path("locked"));
    fs::permissions(path("locked"), fs::perms::owner_read | fs::perms::owner_exec);
    p = path("locked/runs.db");
  }
  try {
    Database db(p);
    FAIL() << "expected a usage error for " << p;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(p));
}

TEST_F(DbTest, ReadOnlyOpenReadsAndChangesNothing) {
  const std::string p = path("shared.db");
  {
    Database db(p);
    db.write_run(load(sample_record()));
  }
  const std::string before = testing::slurp(p);
  {
    Database db(p, DatabaseAccess::kReadOnly);
    EXPECT_EQ(db.records().size(), 1u);
    try {
      db.write_run(load(sample_record()));
      ADD_FAILURE() << "a read-only database took a write";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kRuntime) << e.what();
    }
  }
  EXPECT_EQ(testing::slurp(p), before);
  EXPECT_FALSE(fs::exists(p + "-wal") && fs::file_size(p + "-wal") > 0);
  // Missing or empty files are not databases to read; nothing is created.
  try {
    Database db(path("missing.db"), DatabaseAccess::kReadOnly);
    ADD_FAILURE() << "opened a missing database";
  } catch (const Error& e) {
    EXPECT_TRUE(testing::contains(e.what(), "no database at")) << e.what();
  }
  EXPECT_FALSE(fs::exists(path("missing.db")));
  { std::ofstream touch(path("empty.db")); }
  try {
    Database db(path("empty.db"), DatabaseAccess::kReadOnly);
    ADD_FAILURE() << "opened an empty file";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
  }
  EXPECT_EQ(fs::file_size(path("empty.db")), 0u);
}

TEST_F(DbTest, ReadOnlyOpenOfAPathWithUriCharacters) {
  // The read-only open goes through an SQLite URI: '?', '#' and '%' stay part of the name.
  const std::string p = path("a?mode=rwc#x%41.db");
  {
    Database db(p);
    db.write_run(load(sample_record()));
  }
  Database db(p, DatabaseAccess::kReadOnly);
  EXPECT_EQ(db.records().size(), 1u);
  EXPECT_FALSE(fs::exists(path("a")));
}

TEST_F(DbTest, EmptyFileBecomesADatabase) {
  const std::string p = path("empty.db");
  { std::ofstream touch(p); }
  Database db(p);
  EXPECT_EQ(db.count_runs(), 0);
}

json sample_probe(const std::string& host, const std::string& device_name, int threads,
                  const std::string& created_at, double fp32_flops_per_s) {
  return json{{"schema", "gradscope.probe/1"},
              {"host", host},
              {"device_name", device_name},
              {"threads", threads},
              {"gemm", json::array({{{"dtype", "fp32"}, {"n", 512}, {"flops_per_s", 1e9}}})},
              {"peak", {{"fp32", fp32_flops_per_s}}},
              {"bandwidth_bytes_per_s", 1e10},
              {"created_at", created_at}};
}

TEST_F(DbTest, ProbeRoundTripsWithItsColumns) {
  const std::string p = path("probe.db");
  Database db(p);
  EXPECT_TRUE(db.latest_probe("h", "cpu x", 2).is_null());
  const json probe = sample_probe("h", "cpu x", 2, "2024-01-02T03:04:05Z", 5e10);
  const int64_t id = db.save_probe(probe);
  EXPECT_GT(id, 0);
  EXPECT_EQ(db.latest_probe("h", "cpu x", 2), probe);
  EXPECT_EQ(query(p, "SELECT probe_id, host, device_name, threads, created_at FROM probes"),
            (std::vector<std::vector<std::string>>{
                {std::to_string(id), "h", "cpu x", "2", "2024-01-02T03:04:05Z"}}));
  EXPECT_EQ(json::parse(query(p, "SELECT probe_json FROM probes")[0][0]), probe);
  EXPECT_EQ(db.count_runs(), 0);  // probes are not runs
}

TEST_F(DbTest, LatestProbeIsTheNewestOfTheSameHostDeviceAndThreads) {
  Database db(path("probes.db"));
  db.save_probe(sample_probe("h", "cpu x", 2, "2024-01-02T00:00:00Z", 2e10));
  db.save_probe(sample_probe("h", "cpu x", 2, "2024-03-01T00:00:00Z", 3e10));
  // Stored later but made earlier (a merged file): the newer measurement still wins.
  db.save_probe(sample_probe("h", "cpu x", 2, "2024-02-01T00:00:00Z", 1e10));
  db.save_probe(sample_probe("other", "cpu x", 2, "2024-09-01T00:00:00Z", 9e10));
  db.save_probe(sample_probe("h", "cpu x", 4, "2024-09-01T00:00:00Z", 8e10));
  db.save_probe(sample_probe("h", "gpu y", 2, "2024-09-01T00:00:00Z", 7e10));
  EXPECT_EQ(db.latest_probe("h", "cpu x", 2)["peak"]["fp32"], 3e10);
  EXPECT_EQ(db.latest_probe("h", "cpu x", 4)["peak"]["fp32"], 8e10);
  EXPECT_TRUE(db.latest_probe("h", "cpu x", 1).is_null());
  EXPECT_TRUE(db.latest_probe("nobody", "cpu x", 2).is_null());
  // Same created_at: the one stored last wins.
  db.save_probe(sample_probe("h", "cpu x", 2, "2024-03-01T00:00:00Z", 4e10));
  EXPECT_EQ(db.latest_probe("h", "cpu x", 2)["peak"]["fp32"], 4e10);
}

TEST_F(DbTest, ProbeWithoutItsKeyFieldsIsRefusedAndNotStored) {
  const std::string p = path("bad-probe.db");
  Database db(p);
  for (const char* key : {"host", "device_name", "threads", "created_at"}) {
    json probe = sample_probe("h", "cpu x", 1, "2024-01-01T00:00:00Z", 1e9);
    probe.erase(key);
    try {
      db.save_probe(probe);
      FAIL() << "expected a runtime error without " << key;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kRuntime);
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(db.save_probe(json::array()), Error);
  EXPECT_EQ(query(p, "SELECT count(*) FROM probes")[0][0], "0");
}

TEST_F(DbTest, ProbesTableIsAddedToAnOlderDatabase) {
  // A database written before probes existed has the same schema version and no table.
  const std::string p = path("older.db");
  { Database db(p); }
  exec_raw(p, "DROP INDEX probes_device; DROP TABLE probes;");
  ASSERT_EQ(query(p, "SELECT count(*) FROM sqlite_master WHERE name = 'probes'")[0][0], "0");
  Database db(p);
  db.save_probe(sample_probe("h", "cpu x", 1, "2024-01-01T00:00:00Z", 1e9));
  EXPECT_EQ(db.latest_probe("h", "cpu x", 1)["peak"]["fp32"], 1e9);
  EXPECT_EQ(query(p, "SELECT value FROM meta WHERE key = 'schema_version'")[0][0], "1");
}

TEST(UtcNow, Iso8601) {
  const std::string now = utc_now_iso8601();
  ASSERT_EQ(now.size(), 20u) << now;
  EXPECT_EQ(now[4], '-');
  EXPECT_EQ(now[10], 'T');
  EXPECT_EQ(now.back(), 'Z');
  EXPECT_GE(now.substr(0, 4), "2024");
}

}  // namespace
}  // namespace gradscope

namespace gradscope {
namespace {

// Records of version 1 hold what version 1 let through: the failure record of a configuration
// its run refused (an unknown dtype; a strategy with settings that disagree). The database
// still reads the others, and says which it could not.
TEST(DbVersionOne, RecordsOfRefusedConfigurationsAreListedOrKept) {
  testing::TempDir dir;
  Database db(dir.file("v1.db"));
  db.write_run(load(sample_record("good")));
  json unknown = sample_record("fp16");
  unknown["config"]["dtype"] = "fp16";
  json disagreeing = sample_record("standard-accum");
  disagreeing["status"] = "error";
  disagreeing["config"]["accum_steps"] = 4;  // with strategy standard: refused by the run
  // As version 1 stored them: the record's JSON as written.
  for (const json& r : {unknown, disagreeing}) {
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open(dir.file("v1.db").c_str(), &raw), SQLITE_OK);
    const std::string sql = "INSERT INTO runs(run_id, status, record_json) VALUES ('" +
                            r["run_id"].get<std::string>() + "', '" +
                            r["status"].get<std::string>() + "', '" + r.dump() + "')";
    ASSERT_EQ(sqlite3_exec(raw, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(raw);
  }
  EXPECT_THROW(db.records(), Error);  // a caller that asks for all of them learns of the gap
  std::vector<std::string> unreadable;
  const auto records = db.records(&unreadable);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].run_id, "good");
  // The disagreeing one reads, and is written and named as it was asked for.
  EXPECT_EQ(records[1].run_id, "standard-accum");
  EXPECT_EQ(records[1].config.strategy_label(), "standard");
  EXPECT_EQ(record_to_json(records[1])["config"]["accum_steps"], 4);
  ASSERT_EQ(unreadable.size(), 1u);
  EXPECT_NE(unreadable[0].find("attempt 2"), std::string::npos) << unreadable[0];
  EXPECT_NE(unreadable[0].find("dtype"), std::string::npos) << unreadable[0];
  EXPECT_EQ(unreadable[0].find(dir.path()), std::string::npos) << "no path: " << unreadable[0];
}

}  // namespace
}  // namespace gradscope
