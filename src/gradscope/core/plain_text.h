// Checks of text from outside that becomes names (run ids, sweep names, file names) or one
// line of something (a command-line argument, a task line), shared by every reader.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <string>
#include <string_view>

namespace gradscope {

inline bool is_plain_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
}

// 1 to max_size letters, digits, '.', '_' or '-'.
inline bool is_plain_name(std::string_view text, size_t max_size) {
  return !text.empty() && text.size() <= max_size &&
         std::all_of(text.begin(), text.end(), is_plain_name_char);
}

// `text`, cut to max_size, with every character outside a plain name as '-'.
inline std::string plain_name_from(std::string_view text, size_t max_size) {
  std::string out(text.substr(0, max_size));
  for (char& c : out)
    if (!is_plain_name_char(c)) c = '-';
  return out;
}

// Whether `text` holds a C0 control character (a line break included) or DEL.
inline bool has_control_character(std::string_view text) {
  return std::any_of(text.begin(), text.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
}

// Whether `text` is well-formed UTF-8 (Unicode's table 3-7: no overlong form, no surrogate,
// nothing above U+10FFFF), as JSON output requires.
inline bool is_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xbf;  // the range of the second byte
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xc2 && c <= 0xdf) {
      n = 1;
    } else if (c >= 0xe0 && c <= 0xef) {
      n = 2;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      n = 3;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      return false;
    }
    if (i + n >= text.size()) return false;  // cut short
    for (size_t k = 1; k <= n; ++k) {
      const auto b = static_cast<unsigned char>(text[i + k]);
      if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf)) return false;
    }
    i += n + 1;
  }
  return true;
}

// A label from outside that is shown and stored but never becomes a file name (a record's
// sweep name): 1 to max_size bytes of well-formed UTF-8 with no C0 control character, DEL or
// C1 control (U+0080 to U+009F). Other text, spaces included, is kept as written.
inline bool is_label_text(std::string_view text, size_t max_size) {
  if (text.empty() || text.size() > max_size || has_control_character(text) || !is_utf8(text))
    return false;
  for (size_t i = 0; i + 1 < text.size(); ++i)
    if (static_cast<unsigned char>(text[i]) == 0xc2 &&
        static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
        static_cast<unsigned char>(text[i + 1]) <= 0x9f)
      return false;
  return true;
}

}  // namespace gradscope
