// What a Worker is configured with. Every value comes from the Python side
// (fastps.config.Config, where the defaults and their reasons live); the zero
// values here only mean "not set", and check_options refuses the ones that
// must be set.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fastps {

struct WorkerOptions {
  uint32_t rank = 0;
  uint32_t num_workers = 0;
  std::vector<std::string> servers;    // "host:port" per server id
  std::vector<double> server_weights;  // empty: equal
  std::string job_id;
  std::string token;
  size_t partition_bytes = 0;
  size_t credit_bytes = 0;
  // Bytes of parts more urgent than the next one that may wait unanswered at a server
  // with an even share of the bytes, scaled by each server's share (see
  // Worker::window_open); 0: no such limit.
  size_t window_bytes = 0;
  // A server's nudge moves a part ahead only once it has been queued this long
  // (PushScheduler::boost); 0: at once.
  int64_t nudge_min_wait_us = 0;
  // The network thread pushes the parts that the credit or window it just freed admits,
  // instead of waking the push thread for them (Worker::pump): no hand-off per part; and
  // the caller pushes a small push_pull's parts itself (Worker::enqueue_parts).
  // Compressed parts still go through the push thread. false: every part does.
  bool push_from_io = false;
  // TCP_NOTSENT_LOWAT on the connections to servers; 0: the kernel's default.
  size_t notsent_lowat = 0;
  // Rate cap per server, bytes/s, split over that server's connections
  // (core/control/placement.py pacing_plan); empty or 0: unpaced.
  std::vector<double> pacing_bytes_per_s;
  // While fewer than pacing_burst_bytes wait to be pushed (queued or not yet written), the
  // paced connections send at pacing_burst_bytes_per_s (this host's link rate) instead:
  // the caps above split the link among flows that all send at once, and a short burst's
  // pushes do not overlap the servers' answers. 0 (either): always the caps above.
  size_t pacing_burst_bytes = 0;
  double pacing_burst_bytes_per_s = 0;
  int conns_per_server = 0;
  double connect_timeout_s = 0;
  // Shared memory (BytePS §6.2) and local reduce (§4.2): the workers on this
  // host (this one included; empty: only this one), which servers share this
  // host, and how many hosts have workers (the pushes a server waits for per
  // part once each host pushes its local sum). shm = false: plain TCP only.
  std::vector<uint32_t> local_ranks;
  std::vector<bool> local_servers;
  uint32_t num_hosts = 0;
  // Tensor fusion (worker/fusion.h): buckets hold at most this many bytes (and at
  // most partition_bytes); 0: off.
  size_t fusion_threshold = 0;
  bool shm = false;
  // FASTPS_ROUND_QUORUM is set: plain sums are pushed as quorum rounds (docs/guide/async.md).
  bool quorum = false;
  size_t shm_bytes = 0;
  // Rack-level hierarchy (server/rack_relay.h, core/control/placement.py rack_plan), per server
  // id (empty: flat): the server that this worker's pushes of that server's parts go to
  // (itself when it is in this worker's rack, else this rack's relay for it), and how
  // many pushes the owner waits for per part (the pushers of its rack plus one per other
  // rack). rack_pushers: the pushes per part a relay in this rack waits for.
  std::vector<uint32_t> relay_via;
  std::vector<uint32_t> owner_pushers;
  uint32_t rack_pushers = 0;
};

// Throws std::invalid_argument naming the first field that is unset or out of range.
void check_options(const WorkerOptions& o);

}  // namespace fastps
