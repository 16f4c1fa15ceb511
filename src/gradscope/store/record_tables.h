// The results database's tables of run records, described once: each column with the record
// field it holds (a key path of the record's JSON, docs/record.md). The schema, the inserts
// and the readers (Database::steps_of, ...) are made from this description, and a test holds
// every column to a field of a written record.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gradscope/core/record.h"

namespace gradscope {

struct RecordColumn {
  const char* name;
  const char* type;  // its SQL type: TEXT, INTEGER or REAL
  // The key path of the record's JSON it holds ("memory.peak_bytes"; in a table of entries,
  // the entry's key), "" for the whole record, nullptr for the entry's position in its array.
  const char* field;
  // Where the value is not the field's as written: made from the record and its JSON.
  nlohmann::json (*derive)(const RunRecord&, const nlohmann::json&) = nullptr;
  // Added after databases were first written: an older file lacks it until its next write
  // adds it (its rows stay null, unmeasured).
  bool added = false;
};

struct RecordTable {
  const char* name;
  // The record's array whose entries are the table's rows ("steps"); nullptr for `runs`, one
  // row per attempt.
  const char* entries;
  const char* key;  // the column that orders one attempt's rows (its primary key with it)
  std::vector<RecordColumn> columns;  // after attempt_id, which every table has first
};

// runs, steps, evals and samples, in the order they are created.
const std::vector<RecordTable>& record_tables();
const RecordTable& record_table(const std::string& name);

// The CREATE TABLE statement of a table (IF NOT EXISTS).
std::string create_table_sql(const RecordTable& table);

// A runs column's value for a record (whose JSON is `record_json`): null where the record has
// none; an object (config_json, record_json) as its JSON text.
nlohmann::json run_column_value(const RecordColumn& column, const RunRecord& record,
                                const nlohmann::json& record_json);
// A column's value for the entry at `index` of a table's array.
nlohmann::json entry_column_value(const RecordColumn& column, const nlohmann::json& entry,
                                  size_t index);

}  // namespace gradscope
