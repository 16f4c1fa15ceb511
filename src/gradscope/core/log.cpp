#include "gradscope/core/log.h"

#include <atomic>

namespace gradscope {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kLogLevelInfo)};
}

LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }
void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }

}  // namespace gradscope
