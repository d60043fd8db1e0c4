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
  if (!(o.pacing_burst_bytes_per_s >= 0) || std::isinf(o.pacing_burst_bytes_per_s))
    bad("pacing_burst_bytes_per_s", std::to_string(o.pacing_burst_bytes_per_s),
        "must be a finite rate >= 0");
  if (o.relay_via.empty() && o.owner_pushers.empty()) return;
  size_t n = o.servers.size();
  if (o.relay_via.size() != n || o.owner_pushers.size() != n)
    bad("relay_via", std::to_string(o.relay_via.size()) + " entries",
        ("(and owner_pushers, " + std::to_string(o.owner_pushers.size()) +
         ") must have one per server (" + std::to_string(n) + ")")
            .c_str());
  bool relays = false;
  for (size_t s = 0; s < n; ++s) {
    if (o.relay_via[s] >= n)
      bad("relay_via", std::to_string(o.relay_via[s]), "is not a server index");
    if (o.owner_pushers[s] == 0 || o.owner_pushers[s] > o.num_workers)
      bad("owner_pushers", std::to_string(o.owner_pushers[s]),
          ("must be in 1..num_workers (" + std::to_string(o.num_workers) + ")").c_str());
    relays = relays || o.relay_via[s] != s;
  }
  if (relays && (o.rack_pushers == 0 || o.rack_pushers > o.num_workers))
    bad("rack_pushers", std::to_string(o.rack_pushers),
        ("must be in 1..num_workers (" + std::to_string(o.num_workers) + ") with relays").c_str());
}

}  // namespace fastps
