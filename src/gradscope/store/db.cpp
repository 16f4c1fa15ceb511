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
#include "gradscope/store/record_tables.h"
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
// What the schema holds beside the record tables (store/record_tables.h).
const char* const kIndexAndProbesSql = R"sql(
CREATE INDEX IF NOT EXISTS runs_run_id ON runs(run_id);
CREATE INDEX IF NOT EXISTS runs_sweep ON runs(sweep);
CREATE TABLE IF NOT EXISTS probes(
  probe_id INTEGER PRIMARY KEY,
  host TEXT, device_name TEXT, threads INTEGER, created_at TEXT, probe_json TEXT);
CREATE INDEX IF NOT EXISTS probes_device ON probes(host, device_name, threads);
)sql";

// The whole schema: the record tables, their indexes and the probes.
const std::string& schema_sql() {
  static const std::string sql = [] {
    std::string out;
    for (const RecordTable& t : record_tables()) out += create_table_sql(t);
    return out + kIndexAndProbesSql;
  }();
  return sql;
}

// Columns added to the record tables since databases were first written: the schema lists
// them, and opening an older database for writing adds them (their rows stay null).
const std::vector<AddedColumn>& added_columns() {
  static const std::vector<AddedColumn> added = [] {
    std::vector<AddedColumn> out;
    for (const RecordTable& t : record_tables())
      for (const RecordColumn& c : t.columns)
        if (c.added) out.push_back({t.name, std::string(c.name) + " " + c.type});
    return out;
  }();
  return added;
}

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

// Binds a value of a record's JSON: NULL where it was not measured (null, or not finite),
// never 0; true and false as 1 and 0.
void bind_json(Statement& stmt, int index, const json& v) {
  if (v.is_string()) return stmt.bind_text(index, v.get_ref<const std::string&>());
  if (v.is_boolean()) return stmt.bind_int(index, v.get<bool>() ? 1 : 0);
  if (v.is_number_integer()) return stmt.bind_int(index, v.get<int64_t>());
  if (v.is_number_float() && std::isfinite(v.get<double>()))
    return stmt.bind_real(index, v.get<double>());
  stmt.bind_null(index);
}

// "INSERT INTO table(attempt_id, columns...) VALUES (?, ...)".
std::string insert_sql(const RecordTable& table) {
  std::string names = "attempt_id", marks = "?";
  for (const RecordColumn& c : table.columns) {
    names += std::string(", ") + c.name;
    marks += ",?";
  }
  // runs numbers its rows itself (attempt_id INTEGER PRIMARY KEY).
  if (table.entries == nullptr) {
    names.erase(0, std::strlen("attempt_id, "));
    marks.erase(0, 2);
  }
  return fmt::format("INSERT INTO {}({}) VALUES ({})", table.name, names, marks);
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

namespace fs = std::filesystem;

constexpr char kPathHint[] = "pass another --db path, or a directory that exists and is writable";

// What is checked before SQLite opens the file, so that a file gradscope must not touch
// never is: its folder (for writing), and that an existing file is a readable (writable)
// regular file with SQLite's header.
void check_database_file(const std::string& path, bool read_only) {
  const std::string kHint = kPathHint;
  check_usage(!path.empty(), "the database path is empty", "pass --db FILE.db");
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (!read_only) {
    check_usage(
        fs::is_directory(dir, ec),
        fmt::format("cannot create database {}: directory {} does not exist", path, dir.string()),
        fmt::format("create it first (mkdir -p {}), or {}", dir.string(), kHint));
    check_usage(
        access(dir.c_str(), W_OK | X_OK) == 0,
        fmt::format("cannot use database {}: directory {} is not writable", path, dir.string()),
        "SQLite needs to write its journal beside the database; " + kHint);
  }
  const bool exists = fs::exists(path, ec);
  check_usage(exists || !read_only, fmt::format("no database at {}", path),
              "pass the file given to `gradscope run --db` or `gradscope sweep --db`");
  if (!exists) return;
  check_usage(fs::is_regular_file(path, ec),
              fmt::format("database path {} exists and is not a file", path), kHint);
  check_usage(access(path.c_str(), read_only ? R_OK : R_OK | W_OK) == 0,
              fmt::format("database {} is not {}", path,
                          read_only ? "readable" : "readable and writable"),
              "fix its permissions, or " + kHint);
  check_usage((!read_only && fs::file_size(path, ec) == 0) || has_sqlite_header(path),
              fmt::format("{} is not an SQLite database", path),
              "gradscope leaves it untouched; " + kHint);
}

[[noreturn]] void fail_open(sqlite3* db, const std::string& path, bool read_only, int rc,
                            const std::string& what) {
  fail_usage(fmt::format("cannot open database {}: {}: {}", path, what, sqlite_message(db, rc)),
             read_only ? "check that the file is a gradscope database"
                       : "check that the file is a gradscope database on a local, writable disk, "
                         "or " +
                             std::string(kPathHint));
}

// mode=ro reads a database whose folder or file we may not write. A database in WAL mode
// needs its shared-memory file, which a read-only open cannot create. Only where that is the
// failure and nothing is pending (no write-ahead log with frames in it, no rollback journal)
// is the file read as immutable: it then holds every committed transaction, and no one can be
// writing it without those files. Any other failure (a lock held by a writer, a journal left
// by a crashed one) is reported instead. Returns SQLite's result; `db` is set either way.
int open_read_only(sqlite3*& db, const std::string& path) {
  int rc = sqlite3_open_v2(sqlite_uri(path, "mode=ro").c_str(), &db,
                           SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nullptr);
  if (rc == SQLITE_OK) {
    sqlite3_extended_result_codes(db, 1);
    sqlite3_busy_timeout(db, kBusyTimeoutMs);
    rc = sqlite3_exec(db, "SELECT count(*) FROM sqlite_master", nullptr, nullptr, nullptr);
  }
  const int primary = rc & 0xff;
  std::error_code ec, size_error;
  const bool log_empty =
      !fs::exists(path + "-wal", ec) || fs::file_size(path + "-wal", size_error) == 0;
  const bool no_journal = !fs::exists(path + "-journal", ec);
  if ((primary == SQLITE_CANTOPEN || primary == SQLITE_READONLY) && log_empty && no_journal) {
    sqlite3_close_v2(db);
    db = nullptr;
    return sqlite3_open_v2(sqlite_uri(path, "mode=ro&immutable=1").c_str(), &db,
                           SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nullptr);
  }
  if (rc != SQLITE_OK)
    fail_usage(fmt::format("cannot read database {}: {}", path, sqlite_message(db, rc)),
               primary == SQLITE_BUSY
                   ? "a writer holds it; try again when the sweep or run using it has ended"
                   : "a write was left unfinished (a journal or write-ahead log beside the "
                     "file): open it once where it can be written (any gradscope command with "
                     "--db) to complete it, then report");
  return rc;
}

// Refuses a database that is not empty and not gradscope's, or of a newer schema, or whose
// schema would run SQL of its own on gradscope's writes. Inside the opening transaction.
void check_gradscope_database(sqlite3* db, const std::string& path, bool read_only) {
  const std::string kHint = kPathHint;
  int64_t objects = 0;
  {
    Statement count(db, path, "SELECT count(*) FROM sqlite_master", ErrorKind::kUsage);
    if (count.step()) objects = count.column_int(0);
  }
  check_usage(objects > 0 || !read_only, fmt::format("database {} is empty", path),
              "pass the file given to `gradscope run --db` or `gradscope sweep --db`");
  if (objects == 0) return;
  const std::string foreign = fmt::format(
      "{} is an SQLite database that gradscope did not create (no gradscope meta)", path);
  Statement meta_table(db, path,
                       "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
                       ErrorKind::kUsage);
  check_usage(meta_table.step(), foreign, "gradscope leaves it untouched; " + kHint);
  std::string application;
  std::string version_text;
  try {
    Statement meta(db, path, "SELECT key, value FROM meta", ErrorKind::kUsage);
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
    fail_usage(fmt::format("database {} has no valid schema_version (\"{}\")", path, version_text),
               "the file is damaged; " + kHint);
  }
  check_usage(version <= Database::kSchemaVersion,
              fmt::format("database {} has schema version {}, newer than the {} this "
                          "gradscope (version {}) knows",
                          path, version, Database::kSchemaVersion, GRADSCOPE_VERSION),
              "open it with a newer gradscope, or " + kHint);
  // Triggers, and gradscope's tables defined otherwise, would change what it writes.
  check_database_schema(db, path, schema_sql().c_str(), kMetaSql, added_columns());
}

}  // namespace

Database::Database(const std::string& path, DatabaseAccess mode) : path_(path) {
  const bool read_only = mode == DatabaseAccess::kReadOnly;
  // A file that is not SQLite is refused before SQLite opens it, so it is never touched.
  check_database_file(path_, read_only);
  // Everything after sqlite3_open_v2 runs under this try, so that the handle (which SQLite
  // allocates even when the open fails) is closed on every error, after any transaction
  // guard has rolled back.
  try {
    int rc = read_only ? open_read_only(db_, path_)
                       : sqlite3_open_v2(path_.c_str(), &db_,
                                         SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
    if (rc != SQLITE_OK) fail_open(db_, path_, read_only, rc, "open");
    // The file's schema is not trusted: no SQL in it (a view, a default, an index) may call a
    // function with side effects, and no statement may write the schema itself.
    sqlite3_db_config(db_, SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0, nullptr);
    sqlite3_db_config(db_, SQLITE_DBCONFIG_DEFENSIVE, 1, nullptr);
    sqlite3_extended_result_codes(db_, 1);
    sqlite3_busy_timeout(db_, kBusyTimeoutMs);
    if (!read_only && sqlite3_db_readonly(db_, "main") == 1)
      fail_open(db_, path_, read_only, SQLITE_READONLY, "open for writing");

    // Checked and created inside one write transaction, so two processes opening a new file
    // at once cannot both see it empty; a refused file is only read, then rolled back. A
    // read-only open checks inside a read transaction and creates nothing.
    Transaction txn(db_);
    if ((rc = txn.begin(read_only)) != SQLITE_OK) fail_open(db_, path_, read_only, rc, "lock");
    check_gradscope_database(db_, path_, read_only);
    if (read_only) {
      if ((rc = txn.commit()) != SQLITE_OK) fail_open(db_, path_, read_only, rc, "read");
      return;
    }
    exec(kMetaSql);
    exec(schema_sql());
    // Columns newer than the table: added to a database made before them (their rows stay
    // null, unmeasured).
    add_missing_columns();
    exec(
        fmt::format("INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', '{}'), "
                    "('application', '{}')",
                    kSchemaVersion, kApplication));
    if ((rc = txn.commit()) != SQLITE_OK) fail_open(db_, path_, read_only, rc, "create the schema");
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
  for (const std::string& statement : missing_column_statements(db_, path_, added_columns()))
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
  const json j = record_to_json(record);
  Transaction txn(db_);
  check(txn.begin(), "begin a transaction");
  // Checked inside the write transaction: two processes merging one file store it once.
  if (only_if_new && has_attempt(record.attempt_uid)) return 0;
  int64_t attempt_id = 0;
  for (const RecordTable& table : record_tables()) {
    Statement insert(db_, path_, insert_sql(table).c_str(), ErrorKind::kRuntime);
    if (table.entries == nullptr) {
      int i = 1;
      for (const RecordColumn& c : table.columns)
        bind_json(insert, i++, run_column_value(c, record, j));
      insert.step();
      attempt_id = sqlite3_last_insert_rowid(db_);
      continue;
    }
    const json& entries = j.at(table.entries);
    for (size_t n = 0; n < entries.size(); ++n) {
      insert.reset();
      insert.bind_int(1, attempt_id);
      int i = 2;
      for (const RecordColumn& c : table.columns)
        bind_json(insert, i++, entry_column_value(c, entries[n], n));
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

namespace {

// The columns of one of the entry tables, attempt_id aside, for rows_of.
std::vector<const char*> entry_columns(const RecordTable& table) {
  std::vector<const char*> out;
  for (const RecordColumn& c : table.columns) out.push_back(c.name);
  return out;
}

}  // namespace

std::vector<json> Database::steps_of(int64_t attempt_id) {
  const RecordTable& t = record_table("steps");
  return rows_of(t.name, entry_columns(t), t.key, attempt_id);
}

std::vector<json> Database::evals_of(int64_t attempt_id) {
  const RecordTable& t = record_table("evals");
  return rows_of(t.name, entry_columns(t), t.key, attempt_id);
}

std::vector<json> Database::samples_of(int64_t attempt_id) {
  const RecordTable& t = record_table("samples");
  return rows_of(t.name, entry_columns(t), t.key, attempt_id);
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
