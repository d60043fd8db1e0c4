// What a Server is configured with. Every value comes from the Python side
// (fastps.config.Config, where the defaults live); the zero values here only
// mean "not set", and check_options refuses the ones that must be set.
#pragma once
#include <cstdint>
#include <string>

namespace fastps {

struct ServerOptions {
  uint32_t server_id = 0;
  uint32_t num_workers = 0;
  std::string job_id;
  std::string token;
  std::string host;  // address to bind
  int port = 0;      // 0: any free port (Server::start returns it)
  int io_threads = 0;
  int engine_threads = 0;  // 0: sums on the thread that received the part
  // How long an accepted connection may take to authenticate.
  double handshake_timeout_s = 0;
  // Handshakes under way at once; past it the oldest is turned away (busy).
  int max_pending_handshakes = 0;
  // Elastic servers (docs/guide/elastic.md): a worker's data-plane connection may close without
  // a bye when it moves to a new set of servers; its death is the scheduler's to report.
  bool worker_may_reconnect = false;
  // Beyond lock-step (docs/guide/async.md). Quorum rounds: close a round once this many pushes
  // (or this fraction of the pushers) are in; 0: every pusher. Closed rounds kept for late
  // pushers. Async mode: how many updates a worker may run ahead of the slowest (< 0: any).
  uint32_t round_quorum = 0;
  double round_quorum_fraction = 0;
  uint32_t quorum_history = 8;
  int64_t staleness = -1;
  // Nudge the pushers a part waits for (engine.h, EngineRules::nudge), and after how long
  // half in a skipped part counts (FASTPS_NUDGE_OVERDUE).
  bool nudge = true;
  int64_t nudge_overdue_us = 50000;
};

// Throws std::invalid_argument naming the first field that is unset or out of range.
void check_options(const ServerOptions& o);

}  // namespace fastps
