// Names the calling thread (Linux: at most 15 characters are kept), so `top -H`, perf,
// py-spy and /proc/PID/task/TID/comm tell the core's threads apart.
#pragma once
#include <pthread.h>

#include <string>

namespace fastps {

inline void name_this_thread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

}  // namespace fastps
