#include "gradscope/sweep/grid.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>
#include <set>
#include <string_view>

#include <toml++/toml.h>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/files.h"
#include "gradscope/core/log.h"
#include "gradscope/core/plain_text.h"
#include "gradscope/core/settings.h"

namespace gradscope {
namespace {

// A grid beyond this is a typo (an axis of 1000 seeds) rather than a plan, and expanding it
// would take the memory and time of a crash before any run starts.
constexpr int64_t kMaxRuns = 100000;

// What a run key's value must be, checked at load time so a typo fails with file and line.
enum class ValueKind {
  kText,
  kInteger,
  kNumber,  // integer or float
  kLr,      // a number or "auto"
  kBytes,   // a positive integer, or text such as "512MiB"
  kFlag,    // a boolean: the flag is given when true
};

struct RunKey {
  std::string name;
  ValueKind kind;
  bool defines_run;  // in the run id; the others say how a run is measured
};

// The run settings (core/settings.h) with '-' as '_', less the output ones (--db, --json,
// --quiet, --memory-snapshot, --sweep): a sweep decides those per run itself. opt and arch
// are tables, not scalar keys.
const std::vector<RunKey>& run_key_table() {
  static const std::vector<RunKey> keys = [] {
    std::vector<RunKey> out;
    for (const Setting& s : run_settings()) {
      if (s.role == SettingRole::kRoleOutput || s.type == SettingType::kTypePairs) continue;
      ValueKind kind = ValueKind::kText;
      switch (s.type) {
        case SettingType::kTypeInteger:
          kind = ValueKind::kInteger;
          break;
        case SettingType::kTypeNumber:
          kind = ValueKind::kNumber;
          break;
        case SettingType::kTypeLr:
          kind = ValueKind::kLr;
          break;
        case SettingType::kTypeBytes:
          kind = ValueKind::kBytes;
          break;
        case SettingType::kTypeFlag:
          kind = ValueKind::kFlag;
          break;
        default:
          break;
      }
      out.push_back({s.toml_key(), kind, s.role == SettingRole::kRoleDefines});
    }
    return out;
  }();
  return keys;
}

const RunKey* find_run_key(std::string_view name) {
  for (const auto& key : run_key_table())
    if (name == key.name) return &key;
  return nullptr;
}

bool is_table_key(std::string_view name) {
  const Setting* s = find_setting(std::string(name));
  return s != nullptr && s->type == SettingType::kTypePairs;
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

std::string run_keys_hint(bool with_tables) {
  return "valid keys: " + joined(run_keys()) + (with_tables ? ", and the tables opt and arch" : "");
}

// Axis priority: the four study dimensions first (in the order a reader scans a results
// table), seed last so that repeats of one configuration sit next to each other.
int priority(const std::string& key) {
  static const std::vector<std::string> first = {"model", "preset", "optimizer", "strategy"};
  auto it = std::find(first.begin(), first.end(), key);
  if (it != first.end()) return static_cast<int>(it - first.begin());
  return key == "seed" ? 5 : 4;
}

bool before_in_priority(const std::string& a, const std::string& b) {
  const int pa = priority(a), pb = priority(b);
  return pa != pb ? pa < pb : a < b;
}

// "FILE:LINE" for messages, "FILE" when toml++ knows no line (an implicitly created table).
std::string where(const std::string& file, const toml::source_region& region) {
  return region.begin.line > 0 ? fmt::format("{}:{}", file, region.begin.line) : file;
}

// A key's own position is the most precise; a value's is the fallback.
const toml::source_region& region_of(const toml::key& key, const toml::node& node) {
  return key.source().begin.line > 0 ? key.source() : node.source();
}

// What a node holds, for "must be X, not Y" messages.
std::string describe(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return fmt::format("text \"{}\"", node.as_string()->get());
    case toml::node_type::integer:
      return fmt::format("the integer {}", node.as_integer()->get());
    case toml::node_type::floating_point:
      return fmt::format("the number {}", node.as_floating_point()->get());
    case toml::node_type::boolean:
      return fmt::format("the boolean {}", node.as_boolean()->get());
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    case toml::node_type::date:
    case toml::node_type::time:
    case toml::node_type::date_time:
      return "a date or time";
    default:
      return "an unknown value";
  }
}

// The command-line text of a scalar: strings as is, integers in decimal, floats in fmt's
// shortest round-trip form (0.05 -> "0.05", 3e-4 -> "0.0003", 1e-10 -> "1e-10"), booleans
// "true"/"false". `what` names the value in messages ("'lr' in [fixed]"); `array_hint` says
// what to do instead of an array, which depends on where the value stands.
std::string scalar_text(const std::string& file, const std::string& what, const toml::node& node,
                        const std::string& array_hint) {
  const std::string at = where(file, node.source());
  switch (node.type()) {
    case toml::node_type::string: {
      // A value becomes one argument of a run's command line, one line of a Slurm task
      // list and text in the terminal: a line break or another control character in it
      // would split it or drive the terminal.
      const std::string text(node.as_string()->get());
      check_usage(!has_control_character(text),
                  fmt::format("{}: {} holds a line break or another control character", at, what),
                  "write the value on one line, without control characters");
      return text;
    }
    case toml::node_type::integer:
      return fmt::format("{}", node.as_integer()->get());
    case toml::node_type::floating_point: {
      const double v = node.as_floating_point()->get();
      check_usage(std::isfinite(v),
                  fmt::format("{}: {} must be a finite number, not {}", at, what, v),
                  "write a finite number");
      return fmt::format("{}", v);
    }
    case toml::node_type::boolean:
      return node.as_boolean()->get() ? "true" : "false";
    case toml::node_type::array:
      fail_usage(fmt::format("{}: {} must be a single value, not an array", at, what), array_hint);
    case toml::node_type::table:
      fail_usage(fmt::format("{}: {} must be a single value, not a table", at, what),
                 "write KEY = VALUE with a text, number or boolean VALUE");
    default:
      fail_usage(fmt::format("{}: {} must be text, a number or a boolean, not {}", at, what,
                             describe(node)),
                 "write dates and times as text");
  }
}

// The text of a run key's value, after checking it has the kind the key takes.
std::string run_value_text(const std::string& file, const RunKey& key, const std::string& what,
                           const toml::node& node, const std::string& array_hint) {
  const std::string at = where(file, node.source());
  auto wrong = [&](const char* expected, const char* example) {
    fail_usage(fmt::format("{}: {} must be {}, not {}", at, what, expected, describe(node)),
               fmt::format("write e.g. {} = {}", key.name, example));
  };
  if (node.is_array() || node.is_table()) return scalar_text(file, what, node, array_hint);
  switch (key.kind) {
    case ValueKind::kText:
      if (!node.is_string()) wrong("text", "\"name\"");
      break;
    case ValueKind::kInteger:
      if (!node.is_integer()) wrong("an integer", "4");
      break;
    case ValueKind::kNumber:
      if (!node.is_number()) wrong("a number", "0.1");
      break;
    case ValueKind::kLr:
      if (!node.is_number() && !(node.is_string() && node.as_string()->get() == "auto"))
        wrong("a number or \"auto\"", "3e-4");
      break;
    case ValueKind::kFlag:
      if (!node.is_boolean()) wrong("true or false", "true");
      break;
    case ValueKind::kBytes:
      if (node.is_integer()) {
        check_usage(node.as_integer()->get() > 0,
                    fmt::format("{}: {} must be a positive byte count, not {}", at, what,
                                node.as_integer()->get()),
                    "write e.g. memory_cap = \"8GiB\"");
      } else if (node.is_string()) {
        try {
          parse_bytes(std::string(node.as_string()->get()));
        } catch (const Error& e) {
          fail_usage(fmt::format("{}: {}: {}", at, what, e.what()), e.hint());
        }
      } else {
        wrong("a byte size", "\"8GiB\"");
      }
      break;
  }
  return scalar_text(file, what, node, array_hint);
}

// TOML allows characters beyond ASCII only in strings and comments. toml++ 3.3 reaches
// undefined behaviour on some of them where it looks for whitespace: after a value (a '§'
// after a number), and in a basic string right after a backslash, or as the first character
// after a line-ending backslash. Those are refused here, with line and column, before it sees
// the text. A leading byte order mark is skipped, as toml++ skips it.
void check_toml_ascii(const std::string& text, const std::string& path) {
  enum class In { kCode, kComment, kBasic, kLiteral, kMultiBasic, kMultiLiteral };
  In in = In::kCode;
  int64_t line = 1, column = 0;
  const auto refuse = [&](const char* where) {
    fail_usage(fmt::format("{}:{}:{}: a character beyond ASCII {}", path, line, column, where),
               "write names and numbers in ASCII; other text goes in quotes, not right after a "
               "backslash");
  };
  const auto beyond_ascii = [&](size_t i) { return static_cast<unsigned char>(text[i]) >= 0x80; };
  const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  const auto at = [&](size_t i, const char* s) { return text.compare(i, std::strlen(s), s) == 0; };
  size_t i = at(0, "\xef\xbb\xbf") ? 3 : 0;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    ++column;
    if (c == '\n') {
      ++line;
      column = 0;
      if (in == In::kComment) in = In::kCode;
      continue;
    }
    switch (in) {
      case In::kCode:
        if (beyond_ascii(i)) refuse("outside a string or comment");
        if (at(i, "\"\"\"")) {
          in = In::kMultiBasic;
          i += 2;
        } else if (at(i, "'''")) {
          in = In::kMultiLiteral;
          i += 2;
        } else if (c == '"') {
          in = In::kBasic;
        } else if (c == '\'') {
          in = In::kLiteral;
        } else if (c == '#') {
          in = In::kComment;
        }
        break;
      case In::kComment:
        break;
      case In::kBasic:
      case In::kMultiBasic:
        if (c == '\\' && i + 1 < text.size()) {
          if (in == In::kMultiBasic && blank(text[i + 1])) {
            // A line-ending backslash: the blanks and line breaks after it are trimmed, and
            // the first character after them is read as usual (it may close the string).
            size_t j = i + 1;
            for (; j < text.size() && blank(text[j]); ++j) {
              ++column;
              if (text[j] == '\n') {
                ++line;
                column = 0;
              }
            }
            if (j < text.size() && beyond_ascii(j)) refuse("right after a line-ending backslash");
            i = j - 1;
          } else {
            // An escape: the character after the backslash is not the string's end.
            ++i;
            ++column;
            if (beyond_ascii(i)) refuse("right after a backslash");
          }
        } else if (in == In::kBasic && c == '"') {
          in = In::kCode;
        } else if (in == In::kMultiBasic && at(i, "\"\"\"")) {
          i += 2;
          while (i + 1 < text.size() && text[i + 1] == '"') ++i;  // up to two more quotes
          in = In::kCode;
        }
        break;
      case In::kLiteral:
        if (c == '\'') in = In::kCode;
        break;
      case In::kMultiLiteral:
        if (at(i, "'''")) {
          i += 2;
          while (i + 1 < text.size() && text[i + 1] == '\'') ++i;  // up to two more quotes
          in = In::kCode;
        }
        break;
    }
  }
}

// Reads and parses a TOML file; a missing file and a syntax error are usage errors.
toml::table parse_toml(const std::string& path, const char* kind) {
  namespace fs = std::filesystem;
  std::error_code ec;
  check_usage(fs::exists(path, ec), fmt::format("{} '{}' does not exist", kind, path),
              "check the path");
  check_usage(fs::is_regular_file(path, ec), fmt::format("{} '{}' is not a file", kind, path),
              "give the path of a .toml file");
  const std::string text = read_input_file(path, kind, int64_t{16} << 20);
  check_toml_ascii(text, path);
  try {
    return toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    fail_usage(fmt::format("{}:{}:{}: {}", path, e.source().begin.line, e.source().begin.column,
                           e.description()),
               "fix the TOML syntax (https://toml.io/en/v1.0.0)");
  }
}

const toml::table& expect_table(const std::string& file, const std::string& what,
                                const toml::node& node, const std::string& hint) {
  if (const auto* table = node.as_table()) return *table;
  fail_usage(fmt::format("{}: {} must be a table, not {}", where(file, node.source()), what,
                         describe(node)),
             hint);
}

// NAME = VALUE entries of an opt or arch table (free names, scalar values).
void read_name_table(const std::string& file, const std::string& table_name,
                     const std::string& section, const toml::node& node,
                     std::map<std::string, std::string>& into) {
  const std::string what = fmt::format("'{}' in {}", table_name, section);
  const auto& table =
      expect_table(file, what, node,
                   fmt::format("write {0} = {{ NAME = VALUE, ... }}: each entry becomes --{0} "
                               "NAME=VALUE",
                               table_name));
  for (const auto& [key, value] : table) {
    const std::string name(key.str());
    into[name] = scalar_text(file, fmt::format("'{}' in {}", name, what), value,
                             "write a list as text, e.g. betas = \"0.9,0.999\"");
  }
}

// Run keys plus the opt and arch tables, as in [fixed], an override's `set` and a run
// configuration file. `section` names the place in messages.
void read_run_table(const std::string& file, const toml::table& table, const std::string& section,
                    const std::string& array_hint, RunSpec& into) {
  for (const auto& [key, value] : table) {
    const std::string name(key.str());
    if (is_table_key(name)) {
      auto& target = name == "opt" ? into.opt : into.arch;
      read_name_table(file, name, section, value, target);
      continue;
    }
    const RunKey* run_key = find_run_key(name);
    if (!run_key) {
      std::string hint = run_keys_hint(true);
      if (name == "db") hint = "the database is a sweep setting: put db under [sweep]; " + hint;
      fail_usage(fmt::format("{}: unknown key '{}' in {}", where(file, region_of(key, value)), name,
                             section),
                 hint);
    }
    into.values[name] =
        run_value_text(file, *run_key, fmt::format("'{}' in {}", name, section), value, array_hint);
  }
}

// One `when` or [[exclude]] entry: every key must match one of its values.
struct Condition {
  std::string key;
  std::vector<std::string> any_of;
  std::string at;  // "FILE:LINE" of the key
};
using Match = std::vector<Condition>;

bool matches(const Match& match, const std::map<std::string, std::string>& values) {
  for (const auto& c : match) {
    auto it = values.find(c.key);
    if (it == values.end()) return false;
    if (std::find(c.any_of.begin(), c.any_of.end(), it->second) == c.any_of.end()) return false;
  }
  return true;
}

Match read_match(const std::string& file, const toml::table& table, const std::string& section) {
  Match match;
  for (const auto& [key, value] : table) {
    const std::string name(key.str());
    const std::string at = where(file, region_of(key, value));
    const RunKey* run_key = find_run_key(name);
    if (!run_key) {
      fail_usage(fmt::format("{}: unknown key '{}' in {}", at, name, section),
                 is_table_key(name)
                     ? "opt and arch entries cannot be matched; " + run_keys_hint(false)
                     : run_keys_hint(false));
    }
    const std::string what = fmt::format("'{}' in {}", name, section);
    Condition c{name, {}, at};
    if (const auto* array = value.as_array()) {
      check_usage(!array->empty(), fmt::format("{}: {} is an empty array", at, what),
                  "list the values to match, e.g. optimizer = [\"sgd\", \"adam\"]");
      for (const auto& item : *array)
        c.any_of.push_back(
            run_value_text(file, *run_key, what, item, "list single values; arrays do not nest"));
    } else {
      c.any_of.push_back(run_value_text(file, *run_key, what, value, ""));
    }
    match.push_back(std::move(c));
  }
  return match;
}

// A `when`/exclude key that no run has can never match: almost surely a mistake.
void check_match_keys(const Match& match, const std::set<std::string>& known,
                      const std::string& section, const std::string& known_where) {
  for (const auto& c : match)
    check_usage(known.count(c.key) > 0,
                fmt::format("{}: '{}' in {} never matches: no run sets it", c.at, c.key, section),
                fmt::format("match keys that {} set, or add '{}' there", known_where, c.key));
}

struct Axis {
  std::string key;
  std::vector<std::string> values;
  std::string at;
};

struct Override {
  Match when;
  RunSpec set;
};

const toml::array& expect_array_of_tables(const std::string& file, const std::string& name,
                                          const toml::node& node) {
  const auto* array = node.as_array();
  if (!array || !array->is_array_of_tables())
    fail_usage(fmt::format("{}: '{}' must be written as [[{}]] entries, not {}",
                           where(file, node.source()), name, name, describe(node)),
               fmt::format("start each entry with a [[{}]] line", name));
  return *array;
}

SweepSettings read_settings(const std::string& file, const toml::node& node) {
  SweepSettings s;
  const auto& table =
      expect_table(file, "[sweep]", node, "write [sweep] followed by jobs, run_timeout, ...");
  const std::string valid = "valid keys in [sweep]: jobs, run_timeout, memory_limit, db";
  for (const auto& [key, value] : table) {
    const std::string name(key.str());
    const std::string at = where(file, region_of(key, value));
    const std::string vat = where(file, value.source());
    if (name == "jobs") {
      check_usage(value.is_integer() && value.as_integer()->get() >= 1,
                  fmt::format("{}: 'jobs' in [sweep] must be an integer >= 1, not {}", vat,
                              describe(value)),
                  "write e.g. jobs = 2");
      s.jobs = value.as_integer()->get();
    } else if (name == "run_timeout") {
      const double seconds = value.value<double>().value_or(0);
      check_usage(
          value.is_number() && std::isfinite(seconds) && seconds > 0,
          fmt::format("{}: 'run_timeout' in [sweep] must be a number of seconds > 0, not {}", vat,
                      describe(value)),
          "write e.g. run_timeout = 600");
      s.run_timeout_s = seconds;
    } else if (name == "memory_limit") {
      const std::string hint = "write e.g. memory_limit = \"4GiB\" or memory_limit = 1000000";
      if (value.is_integer()) {
        check_usage(value.as_integer()->get() > 0,
                    fmt::format("{}: 'memory_limit' in [sweep] must be a positive byte count, "
                                "not {}",
                                vat, describe(value)),
                    hint);
        s.memory_limit_bytes = value.as_integer()->get();
      } else if (value.is_string()) {
        try {
          s.memory_limit_bytes = parse_bytes(std::string(value.as_string()->get()));
        } catch (const Error& e) {
          fail_usage(fmt::format("{}: 'memory_limit' in [sweep]: {}", vat, e.what()), e.hint());
        }
      } else {
        fail_usage(fmt::format("{}: 'memory_limit' in [sweep] must be a byte size, not {}", vat,
                               describe(value)),
                   hint);
      }
    } else if (name == "db") {
      check_usage(value.is_string() && !value.as_string()->get().empty(),
                  fmt::format("{}: 'db' in [sweep] must be a file path (text), not {}", vat,
                              describe(value)),
                  "write e.g. db = \"results/sweep.db\"");
      s.db = value.as_string()->get();
    } else {
      fail_usage(fmt::format("{}: unknown key '{}' in [sweep]", at, name),
                 find_run_key(name) || is_table_key(name)
                     ? valid + "; run keys go under [fixed] or [axes]"
                     : valid);
    }
  }
  return s;
}

SlurmSettings read_slurm_settings(const std::string& file, const toml::node& node) {
  SlurmSettings s;
  const auto& table = expect_table(file, "[slurm]", node,
                                   "write [slurm] followed by partition, account, time, ...");
  const std::string valid =
      "valid keys in [slurm]: partition, account, time, mem, gpus_per_task, cpus_per_task";
  for (const auto& [key, value] : table) {
    const std::string name(key.str());
    const std::string vat = where(file, value.source());
    if (name == "cpus_per_task") {
      check_usage(value.is_integer() && value.as_integer()->get() >= 1,
                  fmt::format("{}: 'cpus_per_task' in [slurm] must be an integer >= 1, not {}", vat,
                              describe(value)),
                  "write e.g. cpus_per_task = 8");
      s.cpus_per_task = value.as_integer()->get();
      continue;
    }
    std::string* target = name == "partition"       ? &s.partition
                          : name == "account"       ? &s.account
                          : name == "time"          ? &s.time
                          : name == "mem"           ? &s.mem
                          : name == "gpus_per_task" ? &s.gpus_per_task
                                                    : nullptr;
    check_usage(
        target != nullptr,
        fmt::format("{}: unknown key '{}' in [slurm]", where(file, region_of(key, value)), name),
        valid);
    std::string text;
    if (value.is_string())
      text = value.as_string()->get();
    else if (value.is_integer() && (name == "time" || name == "gpus_per_task" || name == "mem"))
      text = std::to_string(value.as_integer()->get());
    else
      fail_usage(
          fmt::format("{}: '{}' in [slurm] must be text, not {}", vat, name, describe(value)),
          "write e.g. partition = \"gpu\", time = \"02:00:00\"");
    try {
      check_slurm_setting(name, text);
    } catch (const Error& e) {
      fail_usage(fmt::format("{}: {}", vat, e.what()), e.hint());
    }
    *target = text;
  }
  return s;
}

std::vector<Axis> read_axes(const std::string& file, const toml::node& node) {
  std::vector<Axis> axes;
  const auto& table =
      expect_table(file, "[axes]", node, "write [axes] followed by KEY = [VALUE, ...] lines");
  for (const auto& [key, value] : table) {
    const std::string name(key.str());
    const std::string at = where(file, region_of(key, value));
    const RunKey* run_key = find_run_key(name);
    if (!run_key)
      fail_usage(fmt::format("{}: unknown key '{}' in [axes]", at, name),
                 is_table_key(name) ? "opt and arch cannot be axes: set their entries in [fixed] "
                                      "or in an override's set; " +
                                          run_keys_hint(false)
                                    : run_keys_hint(false));
    // Values of a setting outside the run id would all be one run id: the sweep would run
    // it once per value, the database would hold them as attempts of one run, and the
    // report would keep one of them.
    check_usage(run_key->defines_run,
                fmt::format("{}: '{}' cannot be an axis: it says how a run is measured, not "
                            "which run it is, so every value would be the same run id",
                            at, name),
                "set it in [fixed] for every run, or run one sweep per value, each with its "
                "own --db");
    const std::string what = fmt::format("axis '{}'", name);
    const auto* array = value.as_array();
    check_usage(array && !array->empty(),
                fmt::format("{}: {} must be a non-empty array, not {}", where(file, value.source()),
                            what, array ? "an empty array" : describe(value)),
                fmt::format("write e.g. {} = [A, B]; a value for every run goes in [fixed]", name));
    // The cap first: an axis longer than it makes the grid too large whatever else it holds,
    // and its values need not be read.
    check_usage(static_cast<int64_t>(array->size()) <= kMaxRuns,
                fmt::format("{}: {} has {} values, so the grid has at least {} runs, more than the "
                            "cap of {}",
                            at, what, array->size(), array->size(), kMaxRuns),
                "split the sweep into several files, or shorten the axis");
    Axis axis{name, {}, at};
    std::set<std::string> seen;  // each value once: a lookup per value, not a scan
    for (const auto& item : *array) {
      std::string text = run_value_text(file, *run_key, "each value of " + what, item,
                                        "list single values; arrays do not nest");
      check_usage(seen.insert(text).second,
                  fmt::format("{}: {} lists '{}' twice", where(file, item.source()), what, text),
                  "list each value once; repeat runs with a seed axis");
      axis.values.push_back(std::move(text));
    }
    axes.push_back(std::move(axis));
  }
  std::sort(axes.begin(), axes.end(),
            [](const Axis& a, const Axis& b) { return before_in_priority(a.key, b.key); });
  return axes;
}

}  // namespace

void check_slurm_setting(const std::string& key, const std::string& value) {
  // Each form is a whole-text match over letters, digits and . _ - : , alone: nothing in it
  // is a quote, a space, a '$', a '%' (an sbatch file pattern) or a line break.
  struct Form {
    const char* key;
    const char* pattern;
    const char* example;
  };
  static const Form forms[] = {
      {"partition", "[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*", "gpu, or gpu,cpu"},
      {"account", "[A-Za-z0-9_.-]+", "proj-123"},
      {"time", "[0-9]+(-[0-9]+)?(:[0-9]+){0,2}|UNLIMITED|unlimited",
       "90 (minutes), 02:00:00, 1-12:00:00"},
      {"mem", "[0-9]+[KMGT]?", "16G, 16000M"},
      {"gpus_per_task", "([A-Za-z0-9_.-]+:)?[0-9]+", "1, or a100:1"},
  };
  for (const Form& f : forms) {
    if (key != f.key) continue;
    const bool ok = value.size() <= 128 && std::regex_match(value, std::regex(f.pattern));
    check_usage(
        ok, fmt::format("slurm {} '{}' is not of the form Slurm takes", key, terminal_text(value)),
        fmt::format("write e.g. {}; letters, digits and . _ - : , alone", f.example));
    return;
  }
  fail_runtime("check_slurm_setting: no form for '" + key + "'");
}

const std::vector<std::string>& run_keys() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& key : run_key_table()) out.push_back(key.name);
    return out;
  }();
  return names;
}

std::vector<std::string> RunSpec::args() const {
  std::vector<std::string> keys;
  for (const auto& [key, value] : values) keys.push_back(key);
  std::stable_sort(keys.begin(), keys.end(), before_in_priority);
  std::vector<std::string> out;
  for (const auto& key : keys) {
    std::string flag = "--" + key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    const Setting* setting = find_setting(key);
    if (setting != nullptr && setting->type == SettingType::kTypeFlag) {
      // A flag takes no value: given when true, left out when false.
      if (values.at(key) == "true") out.push_back(flag);
      continue;
    }
    out.push_back(flag);
    out.push_back(values.at(key));
  }
  for (const auto& [name, value] : opt) {
    out.push_back("--opt");
    out.push_back(name + "=" + value);
  }
  for (const auto& [name, value] : arch) {
    out.push_back("--arch");
    out.push_back(name + "=" + value);
  }
  return out;
}

std::string RunSpec::label(const std::vector<std::string>& axes) const {
  std::vector<std::string> keys = axes;
  if (keys.empty()) keys = {"model", "preset", "optimizer", "strategy"};
  std::stable_sort(keys.begin(), keys.end(), before_in_priority);
  std::string out;
  for (const auto& key : keys) {
    auto it = values.find(key);
    if (it == values.end()) continue;
    if (!out.empty()) out += ' ';
    out += priority(key) < 4 ? it->second : key + "=" + it->second;
  }
  return out;
}

Sweep load_sweep(const std::string& path) {
  const toml::table root = parse_toml(path, "sweep file");
  Sweep sweep;
  sweep.path = path;
  sweep.name = plain_name_from(std::filesystem::path(path).stem().string(), 64);

  const std::string top_valid =
      "valid top-level keys: name, [sweep], [slurm], [fixed], [axes], [[override]], "
      "[[exclude]]";
  for (const auto& [key, value] : root) {
    const std::string name(key.str());
    if (name == "name" || name == "sweep" || name == "slurm" || name == "fixed" || name == "axes" ||
        name == "override" || name == "exclude")
      continue;
    fail_usage(
        fmt::format("{}: unknown top-level key '{}'", where(path, region_of(key, value)), name),
        find_run_key(name) || is_table_key(name)
            ? "run keys go under [fixed] (every run) or [axes] (varied); " + top_valid
            : top_valid);
  }

  if (const auto* node = root.get("name")) {
    check_usage(node->is_string() && !node->as_string()->get().empty(),
                fmt::format("{}: 'name' must be non-empty text, not {}",
                            where(path, node->source()), describe(*node)),
                "write e.g. name = \"smoke\", or leave it out for the file's stem");
    sweep.name = node->as_string()->get();
    // The name goes into file names, a Slurm job name and the database: a plain name.
    check_usage(is_plain_name(sweep.name, 64),
                fmt::format("{}: 'name' must be at most 64 letters, digits, '.', '_' or '-'",
                            where(path, node->source())),
                "write e.g. name = \"study-tiny\"");
  }
  if (const auto* node = root.get("sweep")) sweep.settings = read_settings(path, *node);
  if (const auto* node = root.get("slurm")) sweep.slurm = read_slurm_settings(path, *node);

  RunSpec fixed;
  std::map<std::string, std::string> fixed_at;  // key -> "FILE:LINE", for the clash message
  if (const auto* node = root.get("fixed")) {
    const auto& table = expect_table(path, "[fixed]", *node, "write [fixed] then KEY = VALUE");
    read_run_table(path, table, "[fixed]", "to vary it, move it to [axes]", fixed);
    for (const auto& [key, value] : table)
      fixed_at[std::string(key.str())] = where(path, region_of(key, value));
  }

  std::vector<Axis> axes;
  if (const auto* node = root.get("axes")) axes = read_axes(path, *node);
  for (const auto& axis : axes) {
    auto it = fixed_at.find(axis.key);
    check_usage(it == fixed_at.end(),
                fmt::format("{}: '{}' is both in [fixed] ({}) and in [axes]", axis.at, axis.key,
                            it == fixed_at.end() ? "" : it->second),
                "keep it in one place: [fixed] for every run, [axes] to vary it");
    sweep.axes.push_back(axis.key);
  }
  // The grid's size before anything is done per run. Each axis is within the cap (read_axes),
  // so the product is counted in a double, which holds any count of these axes exactly enough
  // to be named.
  double grid_runs = 1;
  for (const auto& axis : axes) grid_runs *= static_cast<double>(axis.values.size());
  check_usage(grid_runs <= static_cast<double>(kMaxRuns),
              fmt::format("{}: the grid has {:.0f} runs, more than the cap of {}", path, grid_runs,
                          kMaxRuns),
              "split the sweep into several files, or shorten an axis");
  const auto total = static_cast<int64_t>(grid_runs);

  // Keys a run can have, for the never-matches check.
  std::set<std::string> grid_keys;
  for (const auto& [key, value] : fixed.values) grid_keys.insert(key);
  for (const auto& axis : axes) grid_keys.insert(axis.key);
  std::set<std::string> final_keys = grid_keys;

  std::vector<Override> overrides;
  if (const auto* node = root.get("override")) {
    const auto& entries = expect_array_of_tables(path, "override", *node);
    for (size_t i = 0; i < entries.size(); ++i) {
      const auto& entry = *entries[i].as_table();
      const std::string section = fmt::format("override {}", i + 1);
      const std::string at = where(path, entry.source());
      Override ov;
      for (const auto& [key, value] : entry) {
        const std::string name(key.str());
        if (name == "when") {
          const std::string what = section + "'s when";
          ov.when = read_match(
              path, expect_table(path, what, value, "write when = { KEY = VALUE, ... }"), what);
          check_usage(!ov.when.empty(), fmt::format("{}: {} is empty", at, what),
                      "match at least one key, or put the settings in [fixed]");
          check_match_keys(ov.when, grid_keys, what, "[fixed] or [axes]");
        } else if (name == "set") {
          const std::string what = section + "'s set";
          read_run_table(path, expect_table(path, what, value, "write set = { KEY = VALUE, ... }"),
                         what, "an override sets one value; write one override per value", ov.set);
          check_usage(!ov.set.values.empty() || !ov.set.opt.empty() || !ov.set.arch.empty(),
                      fmt::format("{}: {} is empty", at, what),
                      "set at least one key, or remove the override");
        } else {
          fail_usage(fmt::format("{}: unknown key '{}' in {}", where(path, region_of(key, value)),
                                 name, section),
                     "an [[override]] has exactly two keys: when (what to match) and set (what "
                     "to set)");
        }
      }
      check_usage(entry.contains("when"), fmt::format("{}: {} has no 'when'", at, section),
                  "add when = { KEY = VALUE }; settings for every run go in [fixed]");
      check_usage(entry.contains("set"), fmt::format("{}: {} has no 'set'", at, section),
                  "add set = { KEY = VALUE }");
      for (const auto& [key, value] : ov.set.values) final_keys.insert(key);
      overrides.push_back(std::move(ov));
    }
  }

  std::vector<Match> excludes;
  if (const auto* node = root.get("exclude")) {
    const auto& entries = expect_array_of_tables(path, "exclude", *node);
    for (size_t i = 0; i < entries.size(); ++i) {
      const auto& entry = *entries[i].as_table();
      const std::string section = fmt::format("exclude {}", i + 1);
      Match match = read_match(path, entry, section);
      check_usage(!match.empty(),
                  fmt::format("{}: {} is empty, so it would drop every run",
                              where(path, entry.source()), section),
                  "give the keys a dropped run matches, e.g. model = \"llama\"");
      check_match_keys(match, final_keys, section, "[fixed], [axes] or an override's set");
      excludes.push_back(std::move(match));
    }
  }


  std::vector<size_t> index(axes.size(), 0);
  for (int64_t n = 0; n < total; ++n) {
    RunSpec run = fixed;
    for (size_t a = 0; a < axes.size(); ++a) run.values[axes[a].key] = axes[a].values[index[a]];
    const std::map<std::string, std::string> grid_values = run.values;
    for (const auto& ov : overrides) {
      if (!matches(ov.when, grid_values)) continue;
      for (const auto& [key, value] : ov.set.values) run.values[key] = value;
      for (const auto& [key, value] : ov.set.opt) run.opt[key] = value;
      for (const auto& [key, value] : ov.set.arch) run.arch[key] = value;
    }
    const bool dropped = std::any_of(excludes.begin(), excludes.end(),
                                     [&](const Match& m) { return matches(m, run.values); });
    if (dropped)
      ++sweep.excluded;
    else
      sweep.runs.push_back(std::move(run));
    // Odometer: the last axis turns fastest.
    for (size_t a = axes.size(); a-- > 0;) {
      if (++index[a] < axes[a].values.size()) break;
      index[a] = 0;
    }
  }
  check_usage(!sweep.runs.empty(),
              fmt::format("{}: the grid is empty: [[exclude]] drops all {} of its runs", path,
                          sweep.excluded),
              "remove or narrow an [[exclude]] entry");
  return sweep;
}

RunSpec load_run_config(const std::string& path) {
  const toml::table root = parse_toml(path, "run configuration");
  RunSpec spec;
  for (const auto& [key, value] : root) {
    const std::string name(key.str());
    if (name == "name" || name == "sweep" || name == "slurm" || name == "fixed" || name == "axes" ||
        name == "override" || name == "exclude")
      fail_usage(fmt::format("{}: '{}' belongs in a sweep file, not a run configuration",
                             where(path, region_of(key, value)), name),
                 "run a sweep file with `gradscope sweep FILE`; a run configuration has run keys "
                 "at the top level and optional [opt] and [arch] tables");
  }
  read_run_table(path, root, "the run configuration",
                 "one configuration per file; use gradscope sweep for a grid", spec);
  return spec;
}

}  // namespace gradscope
