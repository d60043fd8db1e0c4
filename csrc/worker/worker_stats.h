// How a worker's parts moved so far: tests check that the shared-memory paths are taken.
#pragma once
#include <atomic>
#include <cstdint>

namespace fastps {

struct WorkerStats {
  std::atomic<uint64_t> pushed_shm{0};          // pushes whose bytes stayed in shared memory
  std::atomic<uint64_t> pushed_socket{0};       // pushes whose bytes went over TCP
  std::atomic<uint64_t> reduced_locally{0};     // parts this worker summed as local owner
  std::atomic<uint64_t> contributed_shm{0};     // parts handed to a local owner in shm
  std::atomic<uint64_t> contributed_socket{0};  // ... over the local socket (no slot free)
  std::atomic<uint64_t> pushed_routed{0};       // routed pushes (forward/concat), over TCP
  std::atomic<uint64_t> nudged{0};  // parts a server was waiting for from this worker only
  // Every byte this worker wrote to / read from its sockets (servers and local peers),
  // frame headers included: what the bytes-on-the-wire benchmark measures.
  std::atomic<uint64_t> socket_bytes_sent{0};
  std::atomic<uint64_t> socket_bytes_received{0};
  // Times the paced connections switched between their caps and the burst rate
  // (Worker::pace_for_backlog).
  std::atomic<uint64_t> pacing_switches{0};
};

}  // namespace fastps
