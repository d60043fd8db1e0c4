#include "common/logging.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>

namespace fastps {

LogLevel log_level() {
  static const LogLevel level = [] {
    const char* v = std::getenv("FASTPS_LOG_LEVEL");
    if (!v) return LogLevel::kWarning;
    if (!strcasecmp(v, "debug")) return LogLevel::kDebug;
    if (!strcasecmp(v, "info")) return LogLevel::kInfo;
    if (!strcasecmp(v, "error")) return LogLevel::kError;
    return LogLevel::kWarning;
  }();
  return level;
}

void log_write(LogLevel level, const std::string& msg) {
  static std::mutex mu;
  static const char* names[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
  std::lock_guard<std::mutex> lock(mu);
  std::cerr << "fastps[" << getpid() << "] " << names[static_cast<int>(level)] << ": " << msg
            << std::endl;
}

}  // namespace fastps
