// Minimal logging to stderr. `--quiet` silences info; warnings and errors always print.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <string>

namespace gradscope {

enum class LogLevel { kQuiet = 0, kInfo = 1, kDebug = 2 };

// `text` with terminal control characters (ESC and the other C0 and C1 controls but newline
// and tab) and Unicode's bidirectional controls shown as '?', so a name or message read from a
// file cannot drive the terminal or reorder what it shows.
std::string terminal_text(std::string text);

LogLevel log_level();
void set_log_level(LogLevel level);

template <typename... Args>
void log_info(fmt::format_string<Args...> format, Args&&... args) {
  if (log_level() >= LogLevel::kInfo)
    fmt::print(stderr, "{}\n", terminal_text(fmt::format(format, std::forward<Args>(args)...)));
}

template <typename... Args>
void log_warn(fmt::format_string<Args...> format, Args&&... args) {
  fmt::print(stderr, "warning: {}\n",
             terminal_text(fmt::format(format, std::forward<Args>(args)...)));
}

}  // namespace gradscope
