#include "server/options.h"

#include <cmath>
#include <stdexcept>

namespace fastps {

namespace {
[[noreturn]] void bad(const std::string& field, const std::string& value, const char* why) {
  throw std::invalid_argument("ServerOptions." + field + " = " + value + ": " + why);
}
}  // namespace

void check_options(const ServerOptions& o) {
  if (o.num_workers == 0) bad("num_workers", "0", "must be >= 1");
  if (o.host.empty()) bad("host", "''", "must name an address to bind");
  if (o.port < 0 || o.port > 65535) bad("port", std::to_string(o.port), "must be in 0..65535");
  if (o.io_threads < 1) bad("io_threads", std::to_string(o.io_threads), "must be >= 1");
  if (o.nudge_overdue_us < 0)
    bad("nudge_overdue_us", std::to_string(o.nudge_overdue_us), "must be >= 0");
  if (o.engine_threads < 0)
    bad("engine_threads", std::to_string(o.engine_threads),
        "must be >= 0 (0: sum on the receiving thread)");
  if (!(o.handshake_timeout_s > 0) || std::isinf(o.handshake_timeout_s))
    bad("handshake_timeout_s", std::to_string(o.handshake_timeout_s),
        "must be a finite number of seconds > 0");
  if (o.max_pending_handshakes < 1)
    bad("max_pending_handshakes", std::to_string(o.max_pending_handshakes), "must be >= 1");
  if (o.round_quorum > o.num_workers)
    bad("round_quorum", std::to_string(o.round_quorum),
        ("exceeds the job's " + std::to_string(o.num_workers) + " workers").c_str());
  if (o.round_quorum && o.round_quorum_fraction > 0)
    bad("round_quorum_fraction", std::to_string(o.round_quorum_fraction),
        "cannot be set together with round_quorum");
  if (!(o.round_quorum_fraction >= 0 && o.round_quorum_fraction <= 1))
    bad("round_quorum_fraction", std::to_string(o.round_quorum_fraction), "must be in [0, 1]");
  if (o.quorum_history < 1) bad("quorum_history", std::to_string(o.quorum_history), "must be >= 1");
}

}  // namespace fastps
