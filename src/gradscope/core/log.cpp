#include "gradscope/core/log.h"

#include <atomic>

namespace gradscope {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kLogLevelInfo)};
}

std::string terminal_text(std::string text) {
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
      text[i] = '?';
    } else if (c == 0xc2 && i + 1 < text.size() &&
               static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(text[i + 1]) <= 0x9f) {
      text.replace(i, 2, "?");  // a C1 control, U+0080 to U+009F, in UTF-8
    }
  }
  return text;
}

LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }
void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }

}  // namespace gradscope
