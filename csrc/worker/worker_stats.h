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
};

}  // namespace fastps
