#include "gradscope/store/db.h"

#include <chrono>
#include <random>

#include <fmt/format.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <set>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/json_input.h"
#include "gradscope/core/settings.h"
#include "gradscope/store/schema_guard.h"

namespace gradscope {
namespace {

using nlohmann::json;

constexpr int kBusyTimeoutMs = 60 * 1000;
constexpr char kApplication[] = "gradscope";
// What to do with a stored row that cannot be read. Its steps, evals and samples rows go
// with it: SQLite reuses the highest attempt_id, and leftovers would clash with the next run.
constexpr char kDamagedRowHint[] =
    "delete the attempt's rows from runs, steps, evals and samples (WHERE attempt_id = N), "
    "or rerun it";
constexpr char kSqliteMagic[] = "SQLite format 3";  // the first 16 bytes, NUL included

const char* const kMetaSql = "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT)";
// Columns added to the schema's tables since databases were first written: the schema below
// lists them, and opening an older database for writing adds them (their rows stay null,
// unmeasured).
const std::vector<AddedColumn> kAddedColumns = {{"runs", "disturbed INTEGER"},
                                                {"runs", "involuntary_switches_per_s REAL"},
                                                {"runs", "steal_pct REAL"},
                                                {"runs", "competing_tasks_mean REAL"}};
const char* const kSchemaSql = R"sql(
CREATE TABLE IF NOT EXISTS runs(
  attempt_id INTEGER PRIMARY KEY,
  run_id TEXT, sweep TEXT, status TEXT, started_at TEXT, finished_at TEXT,
  config_json TEXT, record_json TEXT,
  model TEXT, preset TEXT, optimizer TEXT, strategy TEXT,
  params INTEGER, final_loss REAL, final_val_loss REAL,
  total_s REAL, step_median_s REAL, samples_per_s REAL, tokens_per_s REAL,
  peak_bytes INTEGER, peak_rss_bytes INTEGER, optimizer_state_bytes INTEGER,
  disturbed INTEGER, involuntary_switches_per_s REAL, steal_pct REAL,
  competing_tasks_mean REAL);
CREATE INDEX IF NOT EXISTS runs_run_id ON runs(run_id);
CREATE INDEX IF NOT EXISTS runs_sweep ON runs(sweep);
CREATE TABLE IF NOT EXISTS steps(
  attempt_id INTEGER, step INTEGER, loss REAL, lr REAL, grad_norm REAL, time_s REAL,
  samples INTEGER, tokens INTEGER, targets INTEGER,
  PRIMARY KEY(attempt_id, step));
CREATE TABLE IF NOT EXISTS evals(
  attempt_id INTEGER, step INTEGER, val_loss REAL, accuracy REAL,
  PRIMARY KEY(attempt_id, step));
CREATE TABLE IF NOT EXISTS samples(
  attempt_id INTEGER, sample INTEGER, t_s REAL, allocated_bytes INTEGER, util_pct REAL,
  cpu_util_pct REAL, rss_bytes INTEGER, gpu_util_pct REAL, gpu_memory_used_bytes INTEGER,
  power_w REAL, sm_clock_mhz REAL, energy_j REAL,
  PRIMARY KEY(attempt_id, sample));
CREATE TABLE IF NOT EXISTS probes(
  probe_id INTEGER PRIMARY KEY,
  host TEXT, device_name TEXT, threads INTEGER, created_at TEXT, probe_json TEXT);
CREATE INDEX IF NOT EXISTS probes_device ON probes(host, device_name, threads);
)sql";

std::string sqlite_message(sqlite3* db, int rc) {
  return db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
}

// A prepared statement that finalizes itself. Errors name the database path and SQLite's
// message; `kind` says whether they are the user's (opening a bad file) or the run's.
class Statement {
 public:
  Statement(sqlite3* db, const std::string& path, const char* sql, ErrorKind kind)
      : db_(db), path_(path), kind_(kind) {
    check(sqlite3_prepare_v2(db_, sql, -1, &stmt_, nullptr), "prepare statement");
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  // True while there is a row to read, false when done.
  bool step() {
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    check(rc, "execute statement");
    return false;
  }
  void reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }

  void bind_null(int i) { check(sqlite3_bind_null(stmt_, i), "bind"); }
  void bind_int(int i, int64_t v) { check(sqlite3_bind_int64(stmt_, i, v), "bind"); }
  void bind_real(int i, double v) { check(sqlite3_bind_double(stmt_, i, v), "bind"); }
  void bind_text(int i, const std::string& v) {
    check(sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT),
          "bind");
  }

  bool is_null(int col) { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  int64_t column_int(int col) { return sqlite3_column_int64(stmt_, col); }
  std::string column_text(int col) {
    const auto* text = sqlite3_column_text(stmt_, col);
    return text == nullptr ? std::string()
                           : std::string(reinterpret_cast<const char*>(text),
                                         static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
  }
  // The column as JSON: integer, real, text or null, as SQLite stored it.
  json column_json(int col) {
    switch (sqlite3_column_type(stmt_, col)) {
      case SQLITE_INTEGER:
        return sqlite3_column_int64(stmt_, col);
      case SQLITE_FLOAT:
        return sqlite3_column_double(stmt_, col);
      case SQLITE_NULL:
        return nullptr;
      default:
        return column_text(col);
    }
  }

 private:
  void check(int rc, const char* what) {
    if (rc == SQLITE_OK || rc == SQLITE_ROW || rc == SQLITE_DONE) return;
    throw Error(kind_,
                fmt::format("database {}: {} failed: {}", path_, what, sqlite_message(db_, rc)),
                "check that the file is a gradscope database on a local, writable disk");
  }

  sqlite3* db_;
  const std::string& path_;
  ErrorKind kind_;
  sqlite3_stmt* stmt_ = nullptr;
};

// BEGIN IMMEDIATE takes the write lock up front, so a transaction never fails half-way for
// lack of it (the busy timeout waits for other writers instead). Rolls back unless committed.
class Transaction {
 public:
  explicit Transaction(sqlite3* db) : db_(db) {}
  ~Transaction() {
    if (open_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  // A write transaction, or a read transaction with `read_only`.
  int begin(bool read_only = false) {
    const int rc =
        sqlite3_exec(db_, read_only ? "BEGIN" : "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
    open_ = rc == SQLITE_OK;
    return rc;
  }
  int commit() {
    const int rc = sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr);
    if (rc == SQLITE_OK) open_ = false;
    return rc;
  }

 private:
  sqlite3* db_;
  bool open_ = false;
};

// Binds an optional value: NULL where it was not measured, never 0.
void bind_value(Statement& stmt, int index, const std::optional<double>& v) {
  if (v && std::isfinite(*v)) return stmt.bind_real(index, *v);
  stmt.bind_null(index);
}
void bind_value(Statement& stmt, int index, const std::optional<int64_t>& v) {
  if (v) return stmt.bind_int(index, *v);
  stmt.bind_null(index);
}
void bind_value(Statement& stmt, int index, const std::optional<std::string>& v) {
  if (v && !v->empty()) return stmt.bind_text(index, *v);
  stmt.bind_null(index);
}

bool has_sqlite_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char header[sizeof(kSqliteMagic)] = {};
  in.read(header, sizeof(header));
  return in.gcount() == static_cast<std::streamsize>(sizeof(header)) &&
         std::memcmp(header, kSqliteMagic, sizeof(header)) == 0;
}

}  // namespace

namespace {

// A path as an SQLite URI ("file:" and the path with every byte but plain ones
// percent-encoded), so that a '?' or '#' in a file name stays part of the name.
std::string sqlite_uri(const std::string& path, const std::string& query) {
  // "file://" and an absolute path: an empty authority, so that "//host/x" stays a path.
  std::string uri = !path.empty() && path[0] == '/' ? "file://" : "file:";
  for (const unsigned char c : path) {
    if (std::isalnum(c) || c == '/' || c == '.' || c == '_' || c == '-')
      uri += static_cast<char>(c);
    else
      uri += fmt::format("%{:02X}", c);
  }
  return uri + "?" + query;
}

}  // namespace

Database::Database(const std::string& path, DatabaseAccess mode) : path_(path) {
  namespace fs = std::filesystem;
  const bool read_only = mode == DatabaseAccess::kReadOnly;
  const std::string kHint = "pass another --db path, or a directory that exists and is writable";
  check_usage(!path_.empty(), "the database path is empty", "pass --db FILE.db");
  fs::path dir = fs::path(path_).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (!read_only) {
    check_usage(
        fs::is_directory(dir, ec),
        fmt::format("cannot create database {}: directory {} does not exist", path_, dir.string()),
        fmt::format("create it first (mkdir -p {}), or {}", dir.string(), kHint));
    check_usage(
        access(dir.c_str(), W_OK | X_OK) == 0,
        fmt::format("cannot use database {}: directory {} is not writable", path_, dir.string()),
        "SQLite needs to write its journal beside the database; " + kHint);
  }

  // A file that is not SQLite is refused before SQLite opens it, so it is never touched.
  const bool exists = fs::exists(path_, ec);
  check_usage(exists || !read_only, fmt::format("no database at {}", path_),
              "pass the file given to `gradscope run --db` or `gradscope sweep --db`");
  if (exists) {
    check_usage(fs::is_regular_file(path_, ec),
                fmt::format("database path {} exists and is not a file", path_), kHint);
    check_usage(access(path_.c_str(), read_only ? R_OK : R_OK | W_OK) == 0,
                fmt::format("database {} is not {}", path_,
                            read_only ? "readable" : "readable and writable"),
                "fix its permissions, or " + kHint);
    check_usage((!read_only && fs::file_size(path_, ec) == 0) || has_sqlite_header(path_),
                fmt::format("{} is not an SQLite database", path_),
                "gradscope leaves it untouched; " + kHint);
  }

  // Everything after sqlite3_open_v2 runs under this try, so that the handle (which SQLite
  // allocates even when the open fails) is closed on every error, after any transaction
  // guard has rolled back.
  const auto fail_open = [&](int rc, const std::string& what) {
    fail_usage(fmt::format("cannot open database {}: {}: {}", path_, what, sqlite_message(db_, rc)),
               read_only ? "check that the file is a gradscope database"
                         : "check that the file is a gradscope database on a local, writable disk, "
                           "or " +
                               kHint);
  };
  try {
    int rc = SQLITE_OK;
    if (read_only) {
      // mode=ro reads a database whose folder or file we may not write. A database in WAL
      // mode needs its shared-memory file, which a read-only open cannot create. Only where
      // that is the failure and nothing is pending (no write-ahead log with frames in it,
      // no rollback journal) is the file read as immutable: it then holds every committed
      // transaction, and no one can be writing it without those files. Any other failure
      // (a lock held by a writer, a journal left by a crashed one) is reported instead.
      rc = sqlite3_open_v2(sqlite_uri(path_, "mode=ro").c_str(), &db_,
                           SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nullptr);
      if (rc == SQLITE_OK) {
        sqlite3_extended_result_codes(db_, 1);
        sqlite3_busy_timeout(db_, kBusyTimeoutMs);
        rc = sqlite3_exec(db_, "SELECT count(*) FROM sqlite_master", nullptr, nullptr, nullptr);
      }
      const int primary = rc & 0xff;
      std::error_code size_error;
      const bool log_empty =
          !fs::exists(path_ + "-wal", ec) || fs::file_size(path_ + "-wal", size_error) == 0;
      const bool no_journal = !fs::exists(path_ + "-journal", ec);
      if ((primary == SQLITE_CANTOPEN || primary == SQLITE_READONLY) && log_empty && no_journal) {
        sqlite3_close_v2(db_);
        db_ = nullptr;
        rc = sqlite3_open_v2(sqlite_uri(path_, "mode=ro&immutable=1").c_str(), &db_,
                             SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nullptr);
      } else if (rc != SQLITE_OK) {
        fail_usage(fmt::format("cannot read database {}: {}", path_, sqlite_message(db_, rc)),
                   primary == SQLITE_BUSY
                       ? "a writer holds it; try again when the sweep or run using it has ended"
                       : "a write was left unfinished (a journal or write-ahead log beside the "
                         "file): open it once where it can be written (any gradscope command with "
                         "--db) to complete it, then report");
      }
    } else {
      rc =
          sqlite3_open_v2(path_.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
    }
    if (rc != SQLITE_OK) fail_open(rc, "open");
    // The file's schema is not trusted: no SQL in it (a view, a default, an index) may call a
    // function with side effects, and no statement may write the schema itself.
    sqlite3_db_config(db_, SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0, nullptr);
    sqlite3_db_config(db_, SQLITE_DBCONFIG_DEFENSIVE, 1, nullptr);
    sqlite3_extended_result_codes(db_, 1);
    sqlite3_busy_timeout(db_, kBusyTimeoutMs);
    if (!read_only && sqlite3_db_readonly(db_, "main") == 1)
      fail_open(SQLITE_READONLY, "open for writing");

    // Checked and created inside one write transaction, so two processes opening a new file
    // at once cannot both see it empty; a refused file is only read, then rolled back. A
    // read-only open checks inside a read transaction and creates nothing.
    Transaction txn(db_);
    if ((rc = txn.begin(read_only)) != SQLITE_OK) fail_open(rc, "lock");
    int64_t objects = 0;
    {
      Statement count(db_, path_, "SELECT count(*) FROM sqlite_master", ErrorKind::kUsage);
      if (count.step()) objects = count.column_int(0);
    }
    check_usage(objects > 0 || !read_only, fmt::format("database {} is empty", path_),
                "pass the file given to `gradscope run --db` or `gradscope sweep --db`");
    if (objects > 0) {
      const std::string foreign = fmt::format(
          "{} is an SQLite database that gradscope did not create (no gradscope meta)", path_);
      Statement meta_table(db_, path_,
                           "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
                           ErrorKind::kUsage);
      check_usage(meta_table.step(), foreign, "gradscope leaves it untouched; " + kHint);
      std::string application;
      std::string version_text;
      try {
        Statement meta(db_, path_, "SELECT key, value FROM meta", ErrorKind::kUsage);
        while (meta.step()) {
          const std::string key = meta.column_text(0);
          if (key == "application") application = meta.column_text(1);
          if (key == "schema_version") version_text = meta.column_text(1);
        }
      } catch (const Error&) {
        application.clear();  // a `meta` table of another shape: someone else's
      }
      check_usage(application == kApplication, foreign, "gradscope leaves it untouched; " + kHint);
      int version = 0;
      try {
        version = std::stoi(version_text);
      } catch (const std::exception&) {
        fail_usage(
            fmt::format("database {} has no valid schema_version (\"{}\")", path_, version_text),
            "the file is damaged; " + kHint);
      }
      check_usage(version <= kSchemaVersion,
                  fmt::format("database {} has schema version {}, newer than the {} this "
                              "gradscope (version {}) knows",
                              path_, version, kSchemaVersion, GRADSCOPE_VERSION),
                  "open it with a newer gradscope, or " + kHint);
      // Triggers, and gradscope's tables defined otherwise, would change what it writes.
      check_database_schema(db_, path_, kSchemaSql, kMetaSql, kAddedColumns);
    }
    if (read_only) {
      if ((rc = txn.commit()) != SQLITE_OK) fail_open(rc, "read");
      return;
    }
    exec(kMetaSql);
    exec(kSchemaSql);
    // Columns newer than the table: added to a database made before them (their rows stay
    // null, unmeasured).
    add_missing_columns();
    exec(
        fmt::format("INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', '{}'), "
                    "('application', '{}')",
                    kSchemaVersion, kApplication));
    if ((rc = txn.commit()) != SQLITE_OK) fail_open(rc, "create the schema");
    // After the checks: switching to WAL rewrites the header, which a refused file must not
    // see. Where it cannot be switched (a file system without shared memory, another process
    // holding a lock at this moment) SQLite keeps its rollback journal, which is slower under
    // concurrency but correct, so the result is not checked; an already-WAL file is a no-op.
    sqlite3_exec(db_, "PRAGMA journal_mode=WAL", nullptr, nullptr, nullptr);
  } catch (...) {
    sqlite3_close_v2(db_);
    db_ = nullptr;
    throw;
  }
}

Database::~Database() { sqlite3_close_v2(db_); }

void Database::add_missing_columns() {
  for (const std::string& statement : missing_column_statements(db_, path_, kAddedColumns))
    exec(statement);
}

void Database::check(int rc, const std::string& what) const {
  if (rc == SQLITE_OK) return;
  fail_runtime(fmt::format("database {}: {} failed: {}", path_, what, sqlite_message(db_, rc)),
               "check the disk (space, permissions); the database itself is left consistent");
}

void Database::exec(const std::string& sql) {
  char* message = nullptr;
  const int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &message);
  if (rc == SQLITE_OK) return;
  const std::string text = message != nullptr ? message : sqlite3_errstr(rc);
  sqlite3_free(message);
  fail_runtime(fmt::format("database {}: {} failed: {}", path_, sql.substr(0, 60), text),
               "check the disk (space, permissions); the database itself is left consistent");
}

int64_t Database::write_run(const RunRecord& record) { return insert_run(record, false); }

std::optional<int64_t> Database::write_run_if_new(const RunRecord& record) {
  check_usage(!record.attempt_uid.empty(), "the run record to merge has no attempt_uid",
              "merge the records `gradscope run --json` writes");
  const int64_t id = insert_run(record, true);
  return id > 0 ? std::optional<int64_t>(id) : std::nullopt;
}

int64_t Database::insert_run(const RunRecord& record, bool only_if_new) {
  check_usage(!record.run_id.empty(), "the run record to store has no run_id",
              "pass a record built by train/ or read by record_from_json");
  // Where the record has no final_val_loss, the last evaluation is the final one.
  std::optional<double> final_val_loss = record.final_val_loss;
  if (!final_val_loss && !record.evals.empty()) final_val_loss = record.evals.back().val_loss;
  const json j = record_to_json(record);
  const auto text = [](const std::string& v) {
    return v.empty() ? std::nullopt : std::optional<std::string>(v);
  };
  const RunConfig& c = record.config;
  const auto& time = record.time;
  const auto& put = record.throughput;
  const auto& memory = record.memory;

  Transaction txn(db_);
  check(txn.begin(), "begin a transaction");
  // Checked inside the write transaction: two processes merging one file store it once.
  if (only_if_new && has_attempt(record.attempt_uid)) return 0;
  {
    Statement insert(db_, path_,
                     "INSERT INTO runs(run_id, sweep, status, started_at, finished_at, "
                     "config_json, record_json, model, preset, optimizer, strategy, params, "
                     "final_loss, final_val_loss, total_s, step_median_s, samples_per_s, "
                     "tokens_per_s, peak_bytes, peak_rss_bytes, optimizer_state_bytes, "
                     "disturbed, involuntary_switches_per_s, steal_pct, competing_tasks_mean) "
                     "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                     ErrorKind::kRuntime);
    int i = 1;
    insert.bind_text(i++, record.run_id);
    bind_value(insert, i++, record.sweep);
    insert.bind_text(i++, status_name(record.status));
    bind_value(insert, i++, text(record.started_at));
    bind_value(insert, i++, text(record.finished_at));
    insert.bind_text(i++, j.at("config").dump());
    insert.bind_text(i++, j.dump());
    insert.bind_text(i++, c.model);
    insert.bind_text(i++, c.preset);
    insert.bind_text(i++, c.optimizer);
    insert.bind_text(i++, c.strategy_label());
    bind_value(insert, i++, record.params);
    bind_value(insert, i++, record.final_loss);
    bind_value(insert, i++, final_val_loss);
    bind_value(insert, i++, time ? time->total_s : std::nullopt);
    bind_value(insert, i++, time ? time->step_median_s : std::nullopt);
    bind_value(insert, i++, put ? put->samples_per_s : std::nullopt);
    bind_value(insert, i++, put ? put->tokens_per_s : std::nullopt);
    bind_value(insert, i++, memory ? std::optional<int64_t>(memory->peak_bytes) : std::nullopt);
    bind_value(insert, i++, memory ? memory->peak_rss_bytes : std::nullopt);
    bind_value(insert, i++,
               memory ? std::optional<int64_t>(memory->optimizer_state_bytes) : std::nullopt);
    const auto& contention = record.contention;
    bind_value(insert, i++,
               contention ? std::optional<int64_t>(contention->disturbed ? 1 : 0) : std::nullopt);
    bind_value(insert, i++, contention ? contention->involuntary_switches_per_s : std::nullopt);
    bind_value(insert, i++, contention ? contention->steal_pct : std::nullopt);
    bind_value(insert, i++, contention ? contention->competing_tasks_mean : std::nullopt);
    insert.step();
  }
  const int64_t attempt_id = sqlite3_last_insert_rowid(db_);
  {
    Statement insert(db_, path_,
                     "INSERT INTO steps(attempt_id, step, loss, lr, grad_norm, time_s, samples, "
                     "tokens, targets) VALUES (?,?,?,?,?,?,?,?,?)",
                     ErrorKind::kRuntime);
    for (const StepEntry& s : record.steps) {
      insert.reset();
      insert.bind_int(1, attempt_id);
      insert.bind_int(2, s.step);
      bind_value(insert, 3, s.loss);
      insert.bind_real(4, s.lr);
      bind_value(insert, 5, s.grad_norm);
      insert.bind_real(6, s.time_s);
      insert.bind_int(7, s.samples);
      insert.bind_int(8, s.tokens);
      insert.bind_int(9, s.targets);
      insert.step();
    }
  }
  {
    Statement insert(db_, path_,
                     "INSERT INTO evals(attempt_id, step, val_loss, accuracy) VALUES (?,?,?,?)",
                     ErrorKind::kRuntime);
    for (const EvalEntry& e : record.evals) {
      insert.reset();
      insert.bind_int(1, attempt_id);
      insert.bind_int(2, e.step);
      bind_value(insert, 3, e.val_loss);
      bind_value(insert, 4, e.accuracy);
      insert.step();
    }
  }
  {
    // The sampler's time series (or one entry per timed step without it), numbered in order.
    Statement insert(db_, path_,
                     "INSERT INTO samples(attempt_id, sample, t_s, allocated_bytes, util_pct, "
                     "cpu_util_pct, rss_bytes, gpu_util_pct, gpu_memory_used_bytes, power_w, "
                     "sm_clock_mhz, energy_j) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                     ErrorKind::kRuntime);
    for (size_t n = 0; n < record.timeline.size(); ++n) {
      const TimelineSample& s = record.timeline[n];
      insert.reset();
      insert.bind_int(1, attempt_id);
      insert.bind_int(2, static_cast<int64_t>(n));
      insert.bind_real(3, s.t_s);
      bind_value(insert, 4, s.allocated_bytes);
      bind_value(insert, 5, s.util_pct);
      bind_value(insert, 6, s.cpu_util_pct);
      bind_value(insert, 7, s.rss_bytes);
      bind_value(insert, 8, s.gpu_util_pct);
      bind_value(insert, 9, s.gpu_memory_used_bytes);
      bind_value(insert, 10, s.power_w);
      bind_value(insert, 11, s.sm_clock_mhz);
      bind_value(insert, 12, s.energy_j);
      insert.step();
    }
  }
  check(txn.commit(), "commit the run");
  return attempt_id;
}

std::vector<RunRecord> Database::records(std::vector<std::string>* unreadable) {
  std::vector<RunRecord> out;
  Statement select(db_, path_,
                   "SELECT attempt_id, record_json FROM runs ORDER BY started_at, attempt_id",
                   ErrorKind::kRuntime);
  while (select.step()) {
    const int64_t attempt = select.column_int(0);
    if (unreadable == nullptr) {
      out.push_back(parse_record(attempt, select.column_text(1)));
      continue;
    }
    try {
      out.push_back(record_from_json(parse_json_input(select.column_text(1), "record_json")));
    } catch (const std::exception& e) {
      unreadable->push_back(fmt::format("attempt {}: {}", attempt, e.what()));
    }
  }
  return out;
}

RunRecord Database::parse_record(int64_t attempt_id, const std::string& text) const {
  try {
    return record_from_json(parse_json_input(text, "record_json"));
  } catch (const std::exception& e) {
    fail_runtime(fmt::format("database {}: attempt {} has a damaged record_json: {}", path_,
                             attempt_id, e.what()),
                 kDamagedRowHint);
  }
}

std::vector<RunStatus> Database::statuses_of(const std::string& run_id) {
  Statement select(db_, path_,
                   "SELECT attempt_id, status FROM runs WHERE run_id = ? ORDER BY started_at, "
                   "attempt_id",
                   ErrorKind::kRuntime);
  select.bind_text(1, run_id);
  std::vector<RunStatus> out;
  while (select.step()) {
    const auto status = parse_status(select.column_text(1));
    if (!status)
      fail_runtime(fmt::format("database {}: attempt {} has the unknown status '{}'", path_,
                               select.column_int(0), select.column_text(1)),
                   kDamagedRowHint);
    out.push_back(*status);
  }
  return out;
}

std::optional<RunRecord> Database::latest_record(const std::string& run_id) {
  Statement select(db_, path_,
                   "SELECT attempt_id, record_json FROM runs WHERE run_id = ? ORDER BY "
                   "started_at DESC, attempt_id DESC LIMIT 1",
                   ErrorKind::kRuntime);
  select.bind_text(1, run_id);
  if (!select.step()) return std::nullopt;
  return parse_record(select.column_int(0), select.column_text(1));
}

bool Database::has_attempt(const std::string& attempt_uid) {
  Statement select(
      db_, path_, "SELECT 1 FROM runs WHERE json_extract(record_json, '$.attempt_uid') = ? LIMIT 1",
      ErrorKind::kRuntime);
  select.bind_text(1, attempt_uid);
  return select.step();
}

int64_t Database::count_runs() {
  Statement count(db_, path_, "SELECT count(*) FROM runs", ErrorKind::kRuntime);
  return count.step() ? count.column_int(0) : 0;
}

std::vector<json> Database::rows_of(const char* table, const std::vector<const char*>& columns,
                                    const char* order, int64_t attempt_id) {
  std::string list;
  for (const char* c : columns) list += (list.empty() ? "" : ", ") + std::string(c);
  const std::string sql =
      fmt::format("SELECT {} FROM {} WHERE attempt_id = ? ORDER BY {}", list, table, order);
  Statement select(db_, path_, sql.c_str(), ErrorKind::kRuntime);
  select.bind_int(1, attempt_id);
  std::vector<json> out;
  while (select.step()) {
    json row = json::object();
    for (size_t c = 0; c < columns.size(); ++c)
      row[columns[c]] = select.column_json(static_cast<int>(c));
    out.push_back(std::move(row));
  }
  return out;
}

std::vector<json> Database::steps_of(int64_t attempt_id) {
  return rows_of("steps",
                 {"step", "loss", "lr", "grad_norm", "time_s", "samples", "tokens", "targets"},
                 "step", attempt_id);
}

std::vector<json> Database::evals_of(int64_t attempt_id) {
  return rows_of("evals", {"step", "val_loss", "accuracy"}, "step", attempt_id);
}

std::vector<json> Database::samples_of(int64_t attempt_id) {
  return rows_of("samples",
                 {"sample", "t_s", "allocated_bytes", "util_pct", "cpu_util_pct", "rss_bytes",
                  "gpu_util_pct", "gpu_memory_used_bytes", "power_w", "sm_clock_mhz", "energy_j"},
                 "sample", attempt_id);
}

int64_t Database::save_probe(const json& probe) {
  const auto require = [&](const char* key, bool ok) {
    if (!ok) {
      fail_runtime(fmt::format("the probe record to store has no valid \"{}\"", key),
                   "pass the record built by run_probe (measure/peak.h)");
    }
  };
  require("host", probe.is_object() && probe.contains("host") && probe["host"].is_string());
  require("device_name", probe.contains("device_name") && probe["device_name"].is_string());
  require("threads", probe.contains("threads") && probe["threads"].is_number_integer());
  require("created_at", probe.contains("created_at") && probe["created_at"].is_string());
  Statement insert(db_, path_,
                   "INSERT INTO probes(host, device_name, threads, created_at, probe_json) "
                   "VALUES (?,?,?,?,?)",
                   ErrorKind::kRuntime);
  insert.bind_text(1, probe["host"].get<std::string>());
  insert.bind_text(2, probe["device_name"].get<std::string>());
  insert.bind_int(3, probe["threads"].get<int64_t>());
  insert.bind_text(4, probe["created_at"].get<std::string>());
  insert.bind_text(5, probe.dump());
  insert.step();
  return sqlite3_last_insert_rowid(db_);
}

json Database::latest_probe(const std::string& host, const std::string& device_name, int threads) {
  Statement select(db_, path_,
                   "SELECT probe_json FROM probes WHERE host = ? AND device_name = ? AND "
                   "threads = ? ORDER BY created_at DESC, probe_id DESC LIMIT 1",
                   ErrorKind::kRuntime);
  select.bind_text(1, host);
  select.bind_text(2, device_name);
  select.bind_int(3, threads);
  if (!select.step() || select.is_null(0)) return nullptr;
  std::optional<json> probe = try_parse_json(select.column_text(0), nullptr);
  return probe ? *probe : json(nullptr);
}

std::string new_attempt_uid() {
  std::random_device device;
  const auto draw = [&device] { return (static_cast<uint64_t>(device()) << 32) ^ device(); };
  const uint64_t clock =
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return fmt::format("{:016x}{:016x}", draw(), draw() ^ clock);
}

}  // namespace gradscope
