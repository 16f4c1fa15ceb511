// The results database: one SQLite file (WAL mode) that sweeps append to and reports read.
// Each finished attempt of a run is one `runs` row (its whole record as JSON, plus flat
// columns for the headline metrics so sqlite3 and pandas can query it directly), written in
// one transaction with its `steps` and `evals` rows. Each `gradscope probe` is one `probes`
// row (a device's measured GEMM peak, for MFU). Schema version and owner live in `meta`.
//
// Opening refuses, as a usage error and before any change to the file, a path whose
// directory is missing or not writable, a file that is not SQLite, an SQLite database that
// gradscope did not create, and one written by a newer gradscope.
//
// Not thread-safe: one Database per thread. Several processes may share the file; writers
// wait for each other (busy timeout) rather than fail. Keep ONE Database per file in a
// process: opening checks the file's header through a plain file descriptor, and closing any
// descriptor of a file drops all of the process's POSIX locks on it, including those an
// already open connection holds. Another process may then take the database for unused,
// checkpoint and reset its write-ahead log, and the first connection's next write, made on
// its stale view, overwrites what the other process committed (measured: a sweep lost its
// children's records that way).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gradscope/core/record.h"

struct sqlite3;

namespace gradscope {

// How a database is opened: read and written (created when missing), or only read (a
// report of a database on a read-only disk, or shared by someone else; it must exist).
enum class DatabaseAccess { kReadWrite, kReadOnly };

class Database {
 public:
  // The schema this build writes and the newest it reads.
  static constexpr int kSchemaVersion = 1;

  // Opens path, or creates it with the gradscope schema. Throws usage errors (see above).
  // kReadOnly needs neither the file nor its folder writable, creates nothing, and refuses
  // a missing or empty file.
  explicit Database(const std::string& path, DatabaseAccess mode = DatabaseAccess::kReadWrite);
  ~Database();
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  const std::string& path() const { return path_; }

  // Inserts one attempt: the runs row (its record as JSON, flat columns of its headline
  // figures, its sweep and times) and all of its steps, evals and samples rows, all or
  // nothing. final_val_loss is the record's, else the val_loss of its last evaluation.
  // Returns the new attempt_id. Throws a runtime error (and writes nothing) when the
  // database fails.
  int64_t write_run(const RunRecord& record);
  // The same, unless an attempt with the record's attempt_uid is stored already (checked in
  // the same transaction, so that two processes merging one result file store it once).
  // Returns the new attempt_id, or nullopt when the attempt was there.
  std::optional<int64_t> write_run_if_new(const RunRecord& record);

  // Every attempt's record, in the order the attempts started (started_at, UTC ISO 8601, then
  // the order they were stored): a record merged late by collect still sorts by its time. A record
  // that does not parse (a damaged row, or a version-1 record of a configuration this version
  // cannot express, such as an unknown dtype a run refused) is a runtime error naming its attempt;
  // with `unreadable`, it is left out and described there instead ("attempt 12: ...").
  std::vector<RunRecord> records(std::vector<std::string>* unreadable = nullptr);
  // The statuses of every attempt of one run, in the order the attempts started.
  std::vector<RunStatus> statuses_of(const std::string& run_id);
  // The attempt of one run that started last, or nullopt when it has none.
  std::optional<RunRecord> latest_record(const std::string& run_id);
  // Whether an attempt with this record "attempt_uid" is stored (collect merges each once).
  bool has_attempt(const std::string& attempt_uid);
  int64_t count_runs();
  // The steps rows of one attempt in step order, as {step, loss, lr, grad_norm, time_s,
  // samples, tokens, targets} with SQL NULL as JSON null.
  std::vector<nlohmann::json> steps_of(int64_t attempt_id);
  // The evals rows of one attempt in step order, as {step, val_loss, accuracy}.
  std::vector<nlohmann::json> evals_of(int64_t attempt_id);
  // The samples rows of one attempt (the record's "timeline": the sampler's series) in order,
  // as {sample, t_s, allocated_bytes, util_pct, cpu_util_pct, rss_bytes, gpu_util_pct,
  // gpu_memory_used_bytes, power_w, sm_clock_mhz, energy_j}.
  std::vector<nlohmann::json> samples_of(int64_t attempt_id);

  // Stores one `gradscope probe` record (measure/peak.h) as a `probes` row: its host,
  // device_name, threads and created_at as columns, the whole record as probe_json. Returns
  // the new probe_id. Throws a runtime error (and writes nothing) when the record lacks one
  // of those four fields or the database fails.
  int64_t save_probe(const nlohmann::json& probe);
  // The newest probe (latest created_at, then highest probe_id) of this host, device name
  // and thread count, or null when there is none.
  nlohmann::json latest_probe(const std::string& host, const std::string& device_name, int threads);

 private:
  int64_t insert_run(const RunRecord& record, bool only_if_new);
  // The given columns of a table's rows for one attempt, ordered by `order`.
  std::vector<nlohmann::json> rows_of(const char* table, const std::vector<const char*>& columns,
                                      const char* order, int64_t attempt_id);
  void exec(const std::string& sql);
  void add_missing_columns();
  RunRecord parse_record(int64_t attempt_id, const std::string& text) const;
  void check(int rc, const std::string& what) const;

  std::string path_;
  sqlite3* db_ = nullptr;
};

// A random identity for one attempt of a run (32 hex digits), stored in its record as
// "attempt_uid", so that merging the same result file twice stores it once.
std::string new_attempt_uid();

}  // namespace gradscope
