#include "gradscope/store/db.h"

#include <chrono>
#include <random>

#include <fmt/format.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>

#include "gradscope/core/error.h"

namespace gradscope {
namespace {

using nlohmann::json;

constexpr int kBusyTimeoutMs = 60 * 1000;
constexpr char kApplication[] = "gradscope";
constexpr char kSqliteMagic[] = "SQLite format 3";  // the first 16 bytes, NUL included

const char* const kSchemaSql = R"sql(
CREATE TABLE IF NOT EXISTS runs(
  attempt_id INTEGER PRIMARY KEY,
  run_id TEXT, sweep TEXT, status TEXT, started_at TEXT, finished_at TEXT,
  config_json TEXT, record_json TEXT,
  model TEXT, preset TEXT, optimizer TEXT, strategy TEXT,
  params INTEGER, final_loss REAL, final_val_loss REAL,
  total_s REAL, step_median_s REAL, samples_per_s REAL, tokens_per_s REAL,
  peak_bytes INTEGER, peak_rss_bytes INTEGER, optimizer_state_bytes INTEGER);
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
  int begin() {
    const int rc = sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
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

// record[a][b]..., or nullptr where a key is missing or a level is not an object.
const json* field(const json& record, std::initializer_list<const char*> keys) {
  const json* node = &record;
  for (const char* key : keys) {
    if (!node->is_object()) return nullptr;
    auto it = node->find(key);
    if (it == node->end()) return nullptr;
    node = &*it;
  }
  return node;
}

enum class Column { kText, kInteger, kReal };

// Binds one JSON value to a column of the given type: null or missing is NULL; a value of
// the wrong kind is an error naming the field, since a silent cast would put a wrong number
// (or a 0 where nothing was measured) into the table.
void bind_field(Statement& stmt, int index, const json* value, Column column,
                const std::string& name) {
  if (value == nullptr || value->is_null()) return stmt.bind_null(index);
  const auto wrong = [&](const char* expected) {
    fail_runtime(
        fmt::format("run record field {} is {}, expected {}", name, value->dump(), expected),
        "the run record does not follow the layout in DESIGN.md (Run record)");
  };
  switch (column) {
    case Column::kText:
      if (!value->is_string()) wrong("a string or null");
      return stmt.bind_text(index, value->get<std::string>());
    case Column::kInteger:
      if (value->is_number_unsigned()) {
        const auto v = value->get<uint64_t>();
        if (v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return stmt.bind_int(index, static_cast<int64_t>(v));
        }
        return stmt.bind_real(index, static_cast<double>(v));
      }
      if (value->is_number_integer()) return stmt.bind_int(index, value->get<int64_t>());
      if (value->is_number()) {
        const double v = value->get<double>();
        // An integral float (1e9 written by a formatter) is the integer it spells.
        if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9.0e18) {
          return stmt.bind_int(index, static_cast<int64_t>(v));
        }
        return stmt.bind_real(index, v);
      }
      if (value->is_boolean()) return stmt.bind_int(index, value->get<bool>() ? 1 : 0);
      wrong("an integer or null");
      break;
    case Column::kReal:
      if (value->is_number()) return stmt.bind_real(index, value->get<double>());
      wrong("a number or null");
      break;
  }
}

bool has_sqlite_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char header[sizeof(kSqliteMagic)] = {};
  in.read(header, sizeof(header));
  return in.gcount() == static_cast<std::streamsize>(sizeof(header)) &&
         std::memcmp(header, kSqliteMagic, sizeof(header)) == 0;
}

}  // namespace

Database::Database(const std::string& path) : path_(path) {
  namespace fs = std::filesystem;
  const std::string kHint = "pass another --db path, or a directory that exists and is writable";
  check_usage(!path_.empty(), "the database path is empty", "pass --db FILE.db");
  fs::path dir = fs::path(path_).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  check_usage(
      fs::is_directory(dir, ec),
      fmt::format("cannot create database {}: directory {} does not exist", path_, dir.string()),
      fmt::format("create it first (mkdir -p {}), or {}", dir.string(), kHint));
  check_usage(
      access(dir.c_str(), W_OK | X_OK) == 0,
      fmt::format("cannot use database {}: directory {} is not writable", path_, dir.string()),
      "SQLite needs to write its journal beside the database; " + kHint);

  // A file that is not SQLite is refused before SQLite opens it, so it is never touched.
  const bool exists = fs::exists(path_, ec);
  if (exists) {
    check_usage(fs::is_regular_file(path_, ec),
                fmt::format("database path {} exists and is not a file", path_), kHint);
    check_usage(access(path_.c_str(), R_OK | W_OK) == 0,
                fmt::format("database {} is not readable and writable", path_),
                "fix its permissions, or " + kHint);
    check_usage(fs::file_size(path_, ec) == 0 || has_sqlite_header(path_),
                fmt::format("{} is not an SQLite database", path_),
                "gradscope leaves it untouched; " + kHint);
  }

  // Everything after sqlite3_open_v2 runs under this try, so that the handle (which SQLite
  // allocates even when the open fails) is closed on every error, after any transaction
  // guard has rolled back.
  const auto fail_open = [&](int rc, const std::string& what) {
    fail_usage(
        fmt::format("cannot open database {}: {}: {}", path_, what, sqlite_message(db_, rc)),
        "check that the file is a gradscope database on a local, writable disk, or " + kHint);
  };
  try {
    int rc =
        sqlite3_open_v2(path_.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
    if (rc != SQLITE_OK) fail_open(rc, "open");
    sqlite3_extended_result_codes(db_, 1);
    sqlite3_busy_timeout(db_, kBusyTimeoutMs);
    if (sqlite3_db_readonly(db_, "main") == 1) fail_open(SQLITE_READONLY, "open for writing");

    // Checked and created inside one write transaction, so two processes opening a new file
    // at once cannot both see it empty; a refused file is only read, then rolled back.
    Transaction txn(db_);
    if ((rc = txn.begin()) != SQLITE_OK) fail_open(rc, "lock");
    int64_t objects = 0;
    {
      Statement count(db_, path_, "SELECT count(*) FROM sqlite_master", ErrorKind::kErrorKindUsage);
      if (count.step()) objects = count.column_int(0);
    }
    if (objects > 0) {
      const std::string foreign = fmt::format(
          "{} is an SQLite database that gradscope did not create (no gradscope meta)", path_);
      Statement meta_table(db_, path_,
                           "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
                           ErrorKind::kErrorKindUsage);
      check_usage(meta_table.step(), foreign, "gradscope leaves it untouched; " + kHint);
      std::string application;
      std::string version_text;
      try {
        Statement meta(db_, path_, "SELECT key, value FROM meta", ErrorKind::kErrorKindUsage);
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
    }
    exec("CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT)");
    exec(kSchemaSql);
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

int64_t Database::write_run(const json& record, const std::string& sweep,
                            const std::string& started_at, const std::string& finished_at) {
  if (!record.is_object()) {
    fail_runtime("the run record to store is not a JSON object",
                 "pass the record built by train/ (DESIGN.md, Run record)");
  }
  // Where the record has no final_val_loss, the last evaluation is the final one.
  const json* final_val_loss = field(record, {"final_val_loss"});
  std::string final_val_loss_name = "final_val_loss";
  if (final_val_loss == nullptr) {
    const json* evals = field(record, {"eval"});
    if (evals != nullptr && evals->is_array() && !evals->empty()) {
      final_val_loss = field(evals->back(), {"val_loss"});
      final_val_loss_name = fmt::format("eval[{}].val_loss", evals->size() - 1);
    }
  }
  const json* config = field(record, {"config"});
  const std::string config_json =
      config != nullptr && !config->is_null() ? config->dump() : std::string();
  const json sweep_json = sweep.empty() ? json(nullptr) : json(sweep);
  const json started_json = started_at.empty() ? json(nullptr) : json(started_at);
  const json finished_json = finished_at.empty() ? json(nullptr) : json(finished_at);
  const json config_text = config_json.empty() ? json(nullptr) : json(config_json);
  const json record_text = record.dump();

  struct Flat {
    std::string name;
    const json* value;
    Column column;
  };
  const Flat flat[] = {
      {"run_id", field(record, {"run_id"}), Column::kText},
      {"sweep", &sweep_json, Column::kText},
      {"status", field(record, {"status"}), Column::kText},
      {"started_at", &started_json, Column::kText},
      {"finished_at", &finished_json, Column::kText},
      {"config_json", &config_text, Column::kText},
      {"record_json", &record_text, Column::kText},
      {"config.model", field(record, {"config", "model"}), Column::kText},
      {"config.preset", field(record, {"config", "preset"}), Column::kText},
      {"config.optimizer", field(record, {"config", "optimizer"}), Column::kText},
      {"config.strategy", field(record, {"config", "strategy"}), Column::kText},
      {"params", field(record, {"params"}), Column::kInteger},
      {"final_loss", field(record, {"final_loss"}), Column::kReal},
      {final_val_loss_name, final_val_loss, Column::kReal},
      {"time.total_s", field(record, {"time", "total_s"}), Column::kReal},
      {"time.step_median_s", field(record, {"time", "step_median_s"}), Column::kReal},
      {"throughput.samples_per_s", field(record, {"throughput", "samples_per_s"}), Column::kReal},
      {"throughput.tokens_per_s", field(record, {"throughput", "tokens_per_s"}), Column::kReal},
      {"memory.peak_bytes", field(record, {"memory", "peak_bytes"}), Column::kInteger},
      {"memory.peak_rss_bytes", field(record, {"memory", "peak_rss_bytes"}), Column::kInteger},
      {"memory.optimizer_state_bytes", field(record, {"memory", "optimizer_state_bytes"}),
       Column::kInteger},
  };

  Transaction txn(db_);
  check(txn.begin(), "begin a transaction");
  {
    Statement insert(db_, path_,
                     "INSERT INTO runs(run_id, sweep, status, started_at, finished_at, "
                     "config_json, record_json, model, preset, optimizer, strategy, params, "
                     "final_loss, final_val_loss, total_s, step_median_s, samples_per_s, "
                     "tokens_per_s, peak_bytes, peak_rss_bytes, optimizer_state_bytes) "
                     "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                     ErrorKind::kErrorKindRuntime);
    int index = 1;
    for (const Flat& f : flat) bind_field(insert, index++, f.value, f.column, f.name);
    insert.step();
  }
  const int64_t attempt_id = sqlite3_last_insert_rowid(db_);

  // Rows of one array: each element an object with an integer "step" and the given fields
  // (`numbered`: no step, the element's index is the key).
  const auto insert_rows = [&](const char* array_key, const char* sql,
                               std::initializer_list<std::pair<const char*, Column>> columns,
                               bool numbered = false) {
    const json* rows = field(record, {array_key});
    if (rows == nullptr || rows->is_null()) return;
    if (!rows->is_array()) {
      fail_runtime(fmt::format("run record field {} is not an array", array_key),
                   "the run record does not follow the layout in DESIGN.md (Run record)");
    }
    Statement insert(db_, path_, sql, ErrorKind::kErrorKindRuntime);
    for (size_t i = 0; i < rows->size(); ++i) {
      const json& row = (*rows)[i];
      const std::string where = fmt::format("{}[{}]", array_key, i);
      const json* step = numbered ? nullptr : field(row, {"step"});
      if (!numbered && (step == nullptr || !step->is_number_integer())) {
        fail_runtime(fmt::format("run record entry {} has no integer step", where),
                     "the run record does not follow the layout in DESIGN.md (Run record)");
      }
      insert.reset();
      insert.bind_int(1, attempt_id);
      insert.bind_int(2, numbered ? static_cast<int64_t>(i) : step->get<int64_t>());
      int index = 3;
      for (const auto& [name, column] : columns) {
        bind_field(insert, index++, field(row, {name}), column, where + "." + name);
      }
      insert.step();
    }
  };
  insert_rows("steps",
              "INSERT INTO steps(attempt_id, step, loss, lr, grad_norm, time_s, samples, tokens, "
              "targets) VALUES (?,?,?,?,?,?,?,?,?)",
              {{"loss", Column::kReal},
               {"lr", Column::kReal},
               {"grad_norm", Column::kReal},
               {"time_s", Column::kReal},
               {"samples", Column::kInteger},
               {"tokens", Column::kInteger},
               {"targets", Column::kInteger}});
  insert_rows("eval", "INSERT INTO evals(attempt_id, step, val_loss, accuracy) VALUES (?,?,?,?)",
              {{"val_loss", Column::kReal}, {"accuracy", Column::kReal}});
  // The sampler's time series (or one entry per timed step without it).
  insert_rows("timeline",
              "INSERT INTO samples(attempt_id, sample, t_s, allocated_bytes, util_pct, "
              "cpu_util_pct, rss_bytes, gpu_util_pct, gpu_memory_used_bytes, power_w, "
              "sm_clock_mhz, energy_j) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
              {{"t_s", Column::kReal},
               {"allocated_bytes", Column::kInteger},
               {"util_pct", Column::kReal},
               {"cpu_util_pct", Column::kReal},
               {"rss_bytes", Column::kInteger},
               {"gpu_util_pct", Column::kReal},
               {"gpu_memory_used_bytes", Column::kInteger},
               {"power_w", Column::kReal},
               {"sm_clock_mhz", Column::kReal},
               {"energy_j", Column::kReal}},
              /*numbered=*/true);
  check(txn.commit(), "commit the run");
  return attempt_id;
}

std::vector<json> Database::records() {
  std::vector<json> out;
  Statement select(db_, path_, "SELECT attempt_id, record_json FROM runs ORDER BY attempt_id",
                   ErrorKind::kErrorKindRuntime);
  while (select.step()) {
    if (select.is_null(1)) {
      out.emplace_back(nullptr);
      continue;
    }
    try {
      out.push_back(json::parse(select.column_text(1)));
    } catch (const json::exception& e) {
      fail_runtime(fmt::format("database {}: attempt {} has a damaged record_json: {}", path_,
                               select.column_int(0), e.what()),
                   "delete that row, or rerun the attempt");
    }
  }
  return out;
}

std::vector<std::string> Database::statuses_of(const std::string& run_id) {
  Statement select(db_, path_, "SELECT status FROM runs WHERE run_id = ? ORDER BY attempt_id",
                   ErrorKind::kErrorKindRuntime);
  select.bind_text(1, run_id);
  std::vector<std::string> out;
  while (select.step()) out.push_back(select.is_null(0) ? "" : select.column_text(0));
  return out;
}

json Database::latest_record(const std::string& run_id) {
  Statement select(db_, path_,
                   "SELECT record_json FROM runs WHERE run_id = ? ORDER BY attempt_id DESC LIMIT 1",
                   ErrorKind::kErrorKindRuntime);
  select.bind_text(1, run_id);
  if (!select.step() || select.is_null(0)) return nullptr;
  return json::parse(select.column_text(0), nullptr, /*allow_exceptions=*/false);
}

bool Database::has_attempt(const std::string& attempt_uid) {
  Statement select(
      db_, path_, "SELECT 1 FROM runs WHERE json_extract(record_json, '$.attempt_uid') = ? LIMIT 1",
      ErrorKind::kErrorKindRuntime);
  select.bind_text(1, attempt_uid);
  return select.step();
}

int64_t Database::count_runs() {
  Statement count(db_, path_, "SELECT count(*) FROM runs", ErrorKind::kErrorKindRuntime);
  return count.step() ? count.column_int(0) : 0;
}

std::vector<json> Database::rows_of(const char* table, const std::vector<const char*>& columns,
                                    const char* order, int64_t attempt_id) {
  std::string list;
  for (const char* c : columns) list += (list.empty() ? "" : ", ") + std::string(c);
  const std::string sql =
      fmt::format("SELECT {} FROM {} WHERE attempt_id = ? ORDER BY {}", list, table, order);
  Statement select(db_, path_, sql.c_str(), ErrorKind::kErrorKindRuntime);
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
                   ErrorKind::kErrorKindRuntime);
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
                   ErrorKind::kErrorKindRuntime);
  select.bind_text(1, host);
  select.bind_text(2, device_name);
  select.bind_int(3, threads);
  if (!select.step() || select.is_null(0)) return nullptr;
  json probe = json::parse(select.column_text(0), nullptr, /*allow_exceptions=*/false);
  return probe.is_discarded() ? json(nullptr) : probe;
}

std::string utc_now_iso8601() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string new_attempt_uid() {
  std::random_device device;
  const auto draw = [&device] { return (static_cast<uint64_t>(device()) << 32) ^ device(); };
  const uint64_t clock =
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return fmt::format("{:016x}{:016x}", draw(), draw() ^ clock);
}

}  // namespace gradscope
