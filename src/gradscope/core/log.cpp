#include "gradscope/core/log.h"

#include <atomic>

namespace gradscope {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};

// Unicode's bidirectional controls in UTF-8 at text[i] (0xE2 there): the embeddings and
// overrides U+202A to U+202E, the isolates U+2066 to U+2069, and the marks U+200E, U+200F.
bool is_bidi_control(const std::string& text, size_t i) {
  const auto b1 = static_cast<unsigned char>(text[i + 1]);
  const auto b2 = static_cast<unsigned char>(text[i + 2]);
  return (b1 == 0x80 && ((b2 >= 0xaa && b2 <= 0xae) || b2 == 0x8e || b2 == 0x8f)) ||
         (b1 == 0x81 && b2 >= 0xa6 && b2 <= 0xa9);
}
}  // namespace

std::string terminal_text(std::string text) {
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
      text[i] = '?';
    } else if (c == 0xc2 && i + 1 < text.size() &&
               static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(text[i + 1]) <= 0x9f) {
      text.replace(i, 2, "?");  // a C1 control, U+0080 to U+009F, in UTF-8
    } else if (c == 0xe2 && i + 2 < text.size() && is_bidi_control(text, i)) {
      text.replace(i, 3, "?");  // shown as is, it would reorder the rest of the line
    } else if (c == 0xd8 && i + 1 < text.size() &&
               static_cast<unsigned char>(text[i + 1]) == 0x9c) {
      text.replace(i, 2, "?");  // U+061C, the Arabic letter mark: a bidirectional control too
    }
  }
  return text;
}

LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }
void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }

}  // namespace gradscope
