#include "gradscope/store/record_tables.h"

#include <fmt/format.h>

#include "gradscope/core/error.h"

namespace gradscope {
namespace {

using nlohmann::json;

// The value at a dotted key path of a record's JSON, null where a key on the way is missing.
json value_at(const json& j, const std::string& path) {
  const json* at = &j;
  for (size_t start = 0; !path.empty() && start <= path.size();) {
    const size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot - start);
    if (!at->is_object() || !at->contains(key)) return nullptr;
    at = &(*at)[key];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return at->is_structured() ? json(at->dump()) : *at;
}

// A sweep name given as "" is none.
json sweep_value(const RunRecord& r, const json&) {
  return r.sweep && !r.sweep->empty() ? json(*r.sweep) : json(nullptr);
}

// Where the record has no final_val_loss, the last evaluation is the final one.
json final_val_loss_value(const RunRecord& r, const json& j) {
  if (!r.final_val_loss && !r.evals.empty()) return value_at(j["eval"].back(), "val_loss");
  return value_at(j, "final_val_loss");
}

std::vector<RecordTable> build_tables() {
  return {
      {"runs",
       nullptr,
       "attempt_id",
       {{"run_id", "TEXT", "run_id"},
        {"sweep", "TEXT", "sweep", sweep_value},
        {"status", "TEXT", "status"},
        {"started_at", "TEXT", "started_at"},
        {"finished_at", "TEXT", "finished_at"},
        {"config_json", "TEXT", "config"},
        {"record_json", "TEXT", ""},
        {"model", "TEXT", "config.model"},
        {"preset", "TEXT", "config.preset"},
        {"optimizer", "TEXT", "config.optimizer"},
        {"strategy", "TEXT", "config.strategy"},
        {"params", "INTEGER", "params"},
        {"final_loss", "REAL", "final_loss"},
        {"final_val_loss", "REAL", "final_val_loss", final_val_loss_value},
        {"total_s", "REAL", "time.total_s"},
        {"step_median_s", "REAL", "time.step_median_s"},
        {"samples_per_s", "REAL", "throughput.samples_per_s"},
        {"tokens_per_s", "REAL", "throughput.tokens_per_s"},
        {"peak_bytes", "INTEGER", "memory.peak_bytes"},
        {"peak_rss_bytes", "INTEGER", "memory.peak_rss_bytes"},
        {"optimizer_state_bytes", "INTEGER", "memory.optimizer_state_bytes"},
        {"disturbed", "INTEGER", "contention.disturbed", nullptr, true},
        {"involuntary_switches_per_s", "REAL", "contention.involuntary_switches_per_s", nullptr,
         true},
        {"steal_pct", "REAL", "contention.steal_pct", nullptr, true},
        {"competing_tasks_mean", "REAL", "contention.competing_tasks_mean", nullptr, true}}},
      {"steps",
       "steps",
       "step",
       {{"step", "INTEGER", "step"},
        {"loss", "REAL", "loss"},
        {"lr", "REAL", "lr"},
        {"grad_norm", "REAL", "grad_norm"},
        {"time_s", "REAL", "time_s"},
        {"samples", "INTEGER", "samples"},
        {"tokens", "INTEGER", "tokens"},
        {"targets", "INTEGER", "targets"}}},
      {"evals",
       "eval",
       "step",
       {{"step", "INTEGER", "step"}, {"val_loss", "REAL", "val_loss"},
        {"accuracy", "REAL", "accuracy"}}},
      // The sampler's time series (or one entry per timed step without it), numbered in order.
      {"samples",
       "timeline",
       "sample",
       {{"sample", "INTEGER", nullptr},
        {"t_s", "REAL", "t_s"},
        {"allocated_bytes", "INTEGER", "allocated_bytes"},
        {"util_pct", "REAL", "util_pct"},
        {"cpu_util_pct", "REAL", "cpu_util_pct"},
        {"rss_bytes", "INTEGER", "rss_bytes"},
        {"gpu_util_pct", "REAL", "gpu_util_pct"},
        {"gpu_memory_used_bytes", "INTEGER", "gpu_memory_used_bytes"},
        {"power_w", "REAL", "power_w"},
        {"sm_clock_mhz", "REAL", "sm_clock_mhz"},
        {"energy_j", "REAL", "energy_j"}}},
  };
}

}  // namespace

const std::vector<RecordTable>& record_tables() {
  static const std::vector<RecordTable> tables = build_tables();
  return tables;
}

const RecordTable& record_table(const std::string& name) {
  for (const RecordTable& t : record_tables())
    if (name == t.name) return t;
  fail_runtime("no database table " + name);
}

std::string create_table_sql(const RecordTable& table) {
  const bool per_attempt = table.entries == nullptr;
  std::string sql = fmt::format("CREATE TABLE IF NOT EXISTS {}(\n  attempt_id INTEGER{}",
                                table.name, per_attempt ? " PRIMARY KEY" : "");
  for (const RecordColumn& c : table.columns) sql += fmt::format(",\n  {} {}", c.name, c.type);
  if (!per_attempt) sql += fmt::format(",\n  PRIMARY KEY(attempt_id, {})", table.key);
  return sql + ");\n";
}

json run_column_value(const RecordColumn& column, const RunRecord& record, const json& j) {
  return column.derive ? column.derive(record, j) : value_at(j, column.field);
}

json entry_column_value(const RecordColumn& column, const json& entry, size_t index) {
  if (column.field == nullptr) return static_cast<int64_t>(index);
  return value_at(entry, column.field);
}

}  // namespace gradscope
