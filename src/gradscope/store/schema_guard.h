// What a results database from elsewhere may hold. Its file is data (docs/input-safety.md),
// but SQLite runs the SQL stored in its schema: a trigger fires on gradscope's own writes and
// can delete or rewrite the rows of a run just stored, and a table of gradscope's name defined
// otherwise (ON CONFLICT REPLACE, a view in its place) changes what an insert does. Such a file
// is refused before anything is written; views and indexes of the user's own stay allowed.
#pragma once

#include <string>
#include <vector>

struct sqlite3;

namespace gradscope {

// A column gradscope added to one of its tables after databases were made without it: an
// older file lacks it until its next write adds it (ALTER TABLE ... ADD COLUMN `definition`).
struct AddedColumn {
  std::string table;
  std::string definition;  // "disturbed INTEGER"
};

// A usage error naming the database and every trigger it holds, or the first of gradscope's
// tables (the tables `schema_sql` creates, and `meta`) that is not a table or whose definition
// is not gradscope's. Old databases pass: a table may lack the `added_columns` of its name (or
// hold them appended at its end), and a table added since is created when the file is next
// opened for writing. Definitions are compared column by column and constraint by constraint,
// white space aside, so any other column, constraint or conflict clause is refused. `db` is
// open on the file, inside a transaction that has written nothing.
void check_database_schema(sqlite3* db, const std::string& path, const char* schema_sql,
                           const char* meta_sql, const std::vector<AddedColumn>& added_columns);

// The ALTER TABLE statements that give an older database the `added_columns` it lacks (its
// tables read once each); the names are gradscope's own, never the file's.
std::vector<std::string> missing_column_statements(sqlite3* db, const std::string& path,
                                                   const std::vector<AddedColumn>& added_columns);

// Refuses (a usage error naming `flag` and the file) a database output path that holds
// something else: the path may be new, an empty file or an SQLite file; whether that is a
// gradscope database is checked when it is opened (Database), before anything is written.
void check_database_output(const std::string& flag, const std::string& path);

}  // namespace gradscope
