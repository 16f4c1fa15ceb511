#include "gradscope/report/encode.h"

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include <fmt/format.h>

namespace gradscope {

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

namespace {

bool is_control(char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }

}  // namespace

std::string markdown_escape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const char next = i + 1 < s.size() ? s[i + 1] : ' ';
    // '<' opens raw HTML only before a letter, '/', '!' or '?' ("a < b" stays as it is).
    const bool opens_html = c == '<' && (std::isalpha(static_cast<unsigned char>(next)) ||
                                         next == '/' || next == '!' || next == '?');
    if (c == '|' || opens_html) out += '\\';
    out += is_control(c) ? ' ' : c;
  }
  return out;
}

std::string file_slug(const std::string& s) {
  constexpr size_t kLongest = 64;  // of the kept characters; file names stay far below NAME_MAX
  std::string out;
  bool changed = s.empty() || s.size() > kLongest;
  for (char c : s.substr(0, kLongest)) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    out += keep ? c : '-';
    changed = changed || !keep;
  }
  if (!changed) return out;
  // A kept name has no '.', a changed one always has: the two kinds never meet, and two
  // changed names share a slug only if their 64-bit hashes do.
  uint64_t h = 14695981039346656037ull;  // FNV-1a
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return out + fmt::format(".{:016x}", h);
}

std::string csv_quote(const std::string& text) {
  // A spreadsheet runs a cell that starts with = + - @ (or a tab or carriage return before
  // one) as a formula; such text gets a leading apostrophe, which shows it as text. A whole
  // number such as -1.5 is left as it is.
  std::string s = text;
  if (!s.empty() && std::string("=+-@\t\r").find(s[0]) != std::string::npos) {
    char* end = nullptr;
    std::strtod(s.c_str(), &end);
    if (end != s.c_str() + s.size()) s = "'" + s;
  }
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string csv_row(const std::vector<std::string>& cells) {
  std::string line;
  for (size_t i = 0; i < cells.size(); ++i) line += (i ? "," : "") + csv_quote(cells[i]);
  return line + "\n";
}

std::string csv_number(double v) { return std::isfinite(v) ? fmt::format("{}", v) : ""; }

std::string gnuplot_string(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, is_control(c) ? ' ' : c);
  return out + "'";
}

std::string gnuplot_datum(const std::string& s) {
  std::string out = s;
  for (char& c : out) {
    if (is_control(c)) c = ' ';
    if (c == '"') c = '\'';  // a '"' would open a quoted field that runs into the next ones
  }
  // gnuplot skips blanks, then takes a line that starts with '#' for a comment: the row
  // would vanish from the figure.
  const size_t first = out.find_first_not_of(' ');
  if (first != std::string::npos && out[first] == '#') out[first] = '?';
  return out;
}

std::string gnuplot_number(double v) { return std::isfinite(v) ? fmt::format("{:.6g}", v) : "NaN"; }

std::string base64(const std::string& bytes) {
  static const char* table = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v =
        (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += table[(v >> s) & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = uint8_t(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= uint8_t(bytes[i + 1]) << 8;
    out += table[(v >> 18) & 63];
    out += table[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? table[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

}  // namespace gradscope
