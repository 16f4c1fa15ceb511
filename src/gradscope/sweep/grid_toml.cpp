// Reading a sweep file or run configuration: the TOML text checked and parsed, and its values
// turned into the command-line text a run is given, each problem a usage error with file and
// line.
#include "gradscope/sweep/grid_detail.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "gradscope/core/error.h"
#include "gradscope/core/files.h"
#include "gradscope/core/plain_text.h"

namespace gradscope::grid_detail {
namespace {

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

}  // namespace

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

const toml::array& expect_array_of_tables(const std::string& file, const std::string& name,
                                          const toml::node& node) {
  const auto* array = node.as_array();
  if (!array || !array->is_array_of_tables())
    fail_usage(fmt::format("{}: '{}' must be written as [[{}]] entries, not {}",
                           where(file, node.source()), name, name, describe(node)),
               fmt::format("start each entry with a [[{}]] line", name));
  return *array;
}

}  // namespace gradscope::grid_detail
