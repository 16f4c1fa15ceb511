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

}  // namespace gradscope
