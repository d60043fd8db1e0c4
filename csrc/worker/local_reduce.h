// Local reduce among the workers of one host (BytePS §4.2, §6.2): every part
// has one local owner, a pure function of (tensor id, part index), so all
// local workers agree without talking. The others copy their part into their
// own shared-memory segment and tell the owner where it is; the owner sums
// the contributions (in place, in one of them), pushes that single local sum
// to the part's server, and, once the global sum is back in the same slot,
// tells the others where to copy it from. Each part leaves the host once.
//
// LocalGroup holds what this needs: the worker's own segment and its
// allocator, the mapped segments of the local peers, and the local-socket
// connections that carry the small notices between them.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/buffer_pool.h"
#include "transport/shm.h"
#include "transport/tcp.h"

namespace fastps {

constexpr uint32_t kNoSegment = 0xFFFFFFFFu;

// Where a part's bytes wait while they move through the local stages: a slot
// in some local worker's segment, or (if no slot was free) a private buffer
// whose bytes then travel over the local socket instead.
struct Staging {
  char* data = nullptr;
  uint32_t segment = kNoSegment;  // rank of the worker whose segment holds it
  uint64_t offset = 0;
  std::shared_ptr<Buffer> heap;
  bool empty() const { return data == nullptr; }
  bool in_shm() const { return segment != kNoSegment; }
};

struct LocalGroupOptions {
  std::string job_id;
  std::string token;
  uint32_t rank = 0;
  uint32_t num_workers = 1;
  std::vector<uint32_t> local_ranks;  // every worker on this host, this one included, sorted
  size_t shm_bytes = 256u << 20;
  double timeout_s = 60.0;
};

class LocalGroup {
 public:
  explicit LocalGroup(LocalGroupOptions opts);
  ~LocalGroup();
  // Creates this worker's segment and starts listening for local peers.
  void open();
  // Connects every pair of local workers (lower rank accepts, higher connects)
  // and maps each other's segments. Blocks until done; throws on timeout. The
  // connections are returned for the caller's event loop, handled by handler.
  std::vector<std::shared_ptr<Connection>> connect_peers(FrameHandler* handler);
  // Removes this worker's segment name once everyone who needs it mapped it.
  void unlink_own();
  // Removes the names of every local worker's segment (clean-up after a crash).
  void unlink_all();

  size_t size() const { return opts_.local_ranks.size(); }
  uint32_t rank() const { return opts_.rank; }
  const std::vector<uint32_t>& ranks() const { return opts_.local_ranks; }
  // The local worker (global rank) that reduces and pushes this part.
  uint32_t owner(uint64_t tensor, uint32_t part) const;
  const std::shared_ptr<Connection>& peer(uint32_t rank) const;
  bool is_peer(const Connection* c) const;

  // A slot of len bytes in this worker's segment, else a private buffer.
  Staging stage(size_t len, BufferPool* pool);
  // The bytes at (segment, offset) if that range lies in a local segment.
  char* resolve(uint32_t segment, uint64_t offset, uint64_t len) const;
  // Takes / drops one hold on a slot (no-op for private buffers).
  void ref(const Staging& s, uint32_t n) const;
  void unref(const Staging& s) const;

 private:
  ShmSegment* segment_of(uint32_t rank) const;

  LocalGroupOptions opts_;
  int listen_fd_ = -1;
  std::shared_ptr<ShmSegment> own_;
  std::unique_ptr<ShmArena> arena_;
  bool own_unlinked_ = false;
  std::unordered_map<uint32_t, std::shared_ptr<ShmSegment>> peers_seg_;
  std::unordered_map<uint32_t, std::shared_ptr<Connection>> peers_;
};

}  // namespace fastps
