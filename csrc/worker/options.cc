#include "worker/options.h"

#include <cmath>
#include <stdexcept>

namespace fastps {

namespace {
[[noreturn]] void bad(const std::string& field, const std::string& value, const char* why) {
  throw std::invalid_argument("WorkerOptions." + field + " = " + value + ": " + why);
}
}  // namespace

void check_options(const WorkerOptions& o) {
  if (o.num_workers == 0) bad("num_workers", "0", "must be >= 1");
  if (o.rank >= o.num_workers)
    bad("rank", std::to_string(o.rank),
        ("must be < num_workers (" + std::to_string(o.num_workers) + ")").c_str());
  if (o.partition_bytes == 0) bad("partition_bytes", "0", "must be > 0");
  if (o.credit_bytes == 0) bad("credit_bytes", "0", "must be > 0");
  if (o.conns_per_server < 1)
    bad("conns_per_server", std::to_string(o.conns_per_server), "must be >= 1");
  if (!(o.connect_timeout_s > 0) || std::isinf(o.connect_timeout_s))
    bad("connect_timeout_s", std::to_string(o.connect_timeout_s),
        "must be a finite number of seconds > 0");
  if (o.shm && o.shm_bytes == 0) bad("shm_bytes", "0", "must be > 0 when shm is on");
  for (double r : o.pacing_bytes_per_s)
    if (!(r >= 0)) bad("pacing_bytes_per_s", std::to_string(r), "rates must be >= 0");
}

}  // namespace fastps
