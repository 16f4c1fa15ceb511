#include "gradscope/store/schema_guard.h"

#include <sqlite3.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gradscope/core/error.h"

namespace gradscope {
namespace {

// The rows of a query, each column as text ("" for NULL); a usage error naming the database
// when it fails.
std::vector<std::vector<std::string>> text_rows(sqlite3* db, const std::string& path,
                                                const char* sql) {
  sqlite3_stmt* stmt = nullptr;
  std::vector<std::vector<std::string>> rows;
  int rc = sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr);
  while (rc == SQLITE_OK && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    std::vector<std::string> row;
    for (int i = 0; i < sqlite3_column_count(stmt); ++i) {
      const auto* text = sqlite3_column_text(stmt, i);
      row.push_back(text == nullptr ? std::string() : reinterpret_cast<const char*>(text));
    }
    rows.push_back(std::move(row));
    rc = SQLITE_OK;
  }
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE)
    fail_usage(fmt::format("cannot read the schema of database {}: {}", path, sqlite3_errmsg(db)),
               "check that the file is a gradscope database");
  return rows;
}

// A name as SQLite compares names: ASCII letters without regard to case ("Runs" is "runs").
std::string folded(std::string name) {
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

// gradscope's tables as SQLite stores their definitions (sqlite_master.sql, which keeps the
// text of the CREATE statement less IF NOT EXISTS), made in a database in memory, keyed by
// folded name.
std::map<std::string, std::string> reference_tables(const char* schema_sql, const char* meta_sql) {
  sqlite3* memory = nullptr;
  std::map<std::string, std::string> tables;
  if (sqlite3_open_v2(":memory:", &memory, SQLITE_OPEN_READWRITE, nullptr) == SQLITE_OK &&
      sqlite3_exec(memory, meta_sql, nullptr, nullptr, nullptr) == SQLITE_OK &&
      sqlite3_exec(memory, schema_sql, nullptr, nullptr, nullptr) == SQLITE_OK) {
    for (const auto& row :
         text_rows(memory, ":memory:", "SELECT name, sql FROM sqlite_master WHERE type = 'table'"))
      tables[folded(row[0])] = row[1];
  }
  sqlite3_close_v2(memory);
  if (tables.empty()) fail_runtime("cannot build gradscope's database schema in memory");
  return tables;
}

std::string quoted(const std::string& name) { return "'" + name + "'"; }

// Runs of white space as one space, none at either end.
std::string squeezed(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const bool space = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
    if (space) {
      if (!out.empty() && out.back() != ' ') out += ' ';
    } else {
      out += c;
    }
  }
  if (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

// A CREATE TABLE statement as SQLite keeps it: the text before its column list, the column
// definitions and table constraints of the list (split at its top-level commas, white space
// squeezed), and the text after the list (WITHOUT ROWID, STRICT). Quotes of every kind SQLite
// takes and nested parentheses are stepped over; `valid` is false when the list does not close.
struct TableDefinition {
  std::string head, tail;
  std::vector<std::string> items;
  bool valid = false;
};

TableDefinition parse_table(const std::string& sql) {
  TableDefinition def;
  const size_t open = sql.find('(');
  if (open == std::string::npos) return def;
  def.head = squeezed(sql.substr(0, open));
  int depth = 0;
  char quote = 0;
  std::string item;
  for (size_t i = open + 1; i < sql.size(); ++i) {
    const char c = sql[i];
    if (quote != 0) {
      item += c;
      if (c == quote) quote = 0;  // a doubled quote reopens at the next character
      continue;
    }
    if (c == '\'' || c == '"' || c == '`') quote = c;
    if (c == '[') quote = ']';
    if (c == '(') ++depth;
    if (c == ')' && depth-- == 0) {
      def.items.push_back(squeezed(item));
      def.tail = squeezed(sql.substr(i + 1));
      def.valid = true;
      return def;
    }
    if (c == ',' && depth == 0) {
      def.items.push_back(squeezed(item));
      item.clear();
      continue;
    }
    item += c;
  }
  return def;
}

// Whether `stored` is gradscope's table `reference` as some version of gradscope made it: the
// same text around the list, each of its columns and constraints one of the reference's, and
// any of the reference's it lacks a column that the next write adds (`may_lack`). The order
// may differ: ALTER TABLE ... ADD COLUMN appends a column where a newer CREATE lists it among
// the others.
bool same_table(const std::string& stored, const std::string& reference,
                const std::set<std::string>& may_lack) {
  const TableDefinition have = parse_table(stored), want = parse_table(reference);
  if (!have.valid || !want.valid || have.head != want.head || have.tail != want.tail) return false;
  std::multiset<std::string> left(want.items.begin(), want.items.end());
  for (const std::string& item : have.items) {
    const auto it = left.find(item);
    if (it == left.end()) return false;
    left.erase(it);
  }
  for (const std::string& item : left)
    if (!may_lack.count(item)) return false;
  return true;
}

}  // namespace

void check_database_schema(sqlite3* db, const std::string& path, const char* schema_sql,
                           const char* meta_sql, const std::vector<AddedColumn>& added_columns) {
  const std::string hint =
      "gradscope writes no triggers and defines its tables itself; a database whose schema "
      "runs SQL of its own on gradscope's writes could delete or change results. Store runs in "
      "a new --db file, or, if you trust the file, drop what is named (sqlite3 FILE 'DROP "
      "TRIGGER name;')";
  const auto triggers = text_rows(
      db, path, "SELECT name, tbl_name FROM sqlite_master WHERE type = 'trigger' ORDER BY name");
  if (!triggers.empty()) {
    std::string list;
    for (const auto& row : triggers)
      list += (list.empty() ? "" : ", ") + quoted(row[0]) + " on " + quoted(row[1]);
    fail_usage(fmt::format("database {} holds {} trigger{} ({}), which would run on gradscope's "
                           "writes",
                           path, triggers.size(), triggers.size() == 1 ? "" : "s", list),
               hint);
  }
  const std::map<std::string, std::string> reference = reference_tables(schema_sql, meta_sql);
  for (const auto& row : text_rows(db, path, "SELECT name, type, sql FROM sqlite_master")) {
    const std::string& name = row[0];
    const auto it = reference.find(folded(name));
    if (it == reference.end()) continue;  // the user's own table, view or index
    check_usage(row[1] == "table",
                fmt::format("database {} has a {} named {} where gradscope keeps a table", path,
                            row[1], quoted(name)),
                hint);
    std::set<std::string> may_lack;
    for (const AddedColumn& column : added_columns)
      if (folded(column.table) == folded(name)) may_lack.insert(squeezed(column.definition));
    check_usage(same_table(row[2], it->second, may_lack),
                fmt::format("database {}: table {} is not defined as gradscope defines it", path,
                            quoted(name)),
                hint);
  }
}

std::vector<std::string> missing_column_statements(sqlite3* db, const std::string& path,
                                                   const std::vector<AddedColumn>& added_columns) {
  std::map<std::string, std::set<std::string>> have;  // table -> its columns, read once each
  std::vector<std::string> statements;
  for (const AddedColumn& column : added_columns) {
    if (!have.count(column.table)) {
      const std::string sql = "SELECT name FROM pragma_table_info('" + column.table + "')";
      for (const auto& row : text_rows(db, path, sql.c_str())) have[column.table].insert(row[0]);
    }
    if (!have[column.table].count(column.definition.substr(0, column.definition.find(' '))))
      statements.push_back("ALTER TABLE " + column.table + " ADD COLUMN " + column.definition);
  }
  return statements;
}

void check_database_output(const std::string& flag, const std::string& path) {
  check_usage(!path.empty(), flag + " needs a file name", "pass --db FILE.db");
  const std::string hint = fmt::format(
      "{} takes a gradscope results database, or a new file name: choose another path", flag);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;  // a new file; its folder is checked on opening
  check_usage(S_ISREG(st.st_mode),
              fmt::format("{} {}: it is {}, not a database", flag, path,
                          S_ISDIR(st.st_mode) ? "a folder" : "not a regular file"),
              hint);
  if (st.st_size == 0) return;
  char header[16] = {};
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  check_usage(fd >= 0, fmt::format("{} {}: cannot read it: {}", flag, path, std::strerror(errno)),
              "fix its permissions, or choose another path");
  const ssize_t n = ::pread(fd, header, sizeof(header), 0);
  ::close(fd);
  check_usage(n == static_cast<ssize_t>(sizeof(header)) &&
                  std::memcmp(header, "SQLite format 3", sizeof(header)) == 0,
              fmt::format("{} {}: it is not an SQLite database, and gradscope would write one "
                          "there",
                          flag, path),
              hint);
}

}  // namespace gradscope
