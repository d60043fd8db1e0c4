// Minimal leveled logging to stderr. The level comes from FASTPS_LOG_LEVEL
// (debug, info, warning, error; default warning) so that a healthy job is quiet.
#pragma once
#include <sstream>
#include <string>

namespace fastps {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

LogLevel log_level();
void log_write(LogLevel level, const std::string& msg);

}  // namespace fastps

#define FASTPS_LOG(level, expr)                                               \
  do {                                                                        \
    if (static_cast<int>(level) >= static_cast<int>(::fastps::log_level())) { \
      std::ostringstream fastps_log_os_;                                      \
      fastps_log_os_ << expr;                                                 \
      ::fastps::log_write(level, fastps_log_os_.str());                       \
    }                                                                         \
  } while (0)

#define LOG_DEBUG(expr) FASTPS_LOG(::fastps::LogLevel::kDebug, expr)
#define LOG_INFO(expr) FASTPS_LOG(::fastps::LogLevel::kInfo, expr)
#define LOG_WARN(expr) FASTPS_LOG(::fastps::LogLevel::kWarning, expr)
#define LOG_ERROR(expr) FASTPS_LOG(::fastps::LogLevel::kError, expr)
