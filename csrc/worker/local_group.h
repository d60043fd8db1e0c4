// The workers of one host as a group (BytePS §6.2): the worker's own
// shared-memory segment and its allocator, the mapped segments of the local
// peers, the local-socket connections that carry the small notices between
// them, and which local worker owns (reduces and pushes) each part. The local
// reduce protocol that runs over this group lives in worker/local_reducer.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/buffer_pool.h"
#include "transport/job_claim.h"
#include "transport/link.h"
#include "transport/payload.h"
#include "transport/shm.h"
#include "transport/tcp.h"

namespace fastps {

struct LocalGroupOptions {
  std::string job_id;
  std::string token;
  uint32_t rank = 0;
  uint32_t num_workers = 1;
  std::vector<uint32_t> local_ranks;  // every worker on this host, this one included, sorted
  size_t shm_bytes = 0;               // set from WorkerOptions, like every field here
  double timeout_s = 0;
  // Polled while waiting for peers: a non-empty answer (the job aborted) ends the wait.
  std::function<std::string()> cancelled;
};

class LocalGroup : public SlotSpace {
 public:
  explicit LocalGroup(LocalGroupOptions opts);
  ~LocalGroup() override;
  // Creates this worker's segment and starts listening for local peers.
  void open();
  // Connects every pair of local workers (lower rank accepts, higher connects)
  // and maps each other's segments. Blocks until done; throws on timeout. The
  // connections (local stream sockets) are returned for the caller's event loop,
  // handled by handler.
  std::vector<std::shared_ptr<TcpConnection>> connect_peers(FrameHandler* handler);
  // Removes this worker's segment name once everyone who needs it mapped it.
  void unlink_own();
  // Removes the names of every local worker's segment (clean-up after a crash).
  void unlink_all();

  size_t size() const { return opts_.local_ranks.size(); }
  uint32_t rank() const { return opts_.rank; }
  const std::vector<uint32_t>& ranks() const { return opts_.local_ranks; }
  // The local worker (global rank) that reduces and pushes this part.
  uint32_t owner(uint64_t tensor, uint32_t part) const;
  // The link to a local peer (it maps this worker's segment, and this worker its).
  const Link& peer(uint32_t rank) const;
  // False for a peer whose connection was never set up (start-up failed first).
  bool connected(uint32_t rank) const { return peers_.count(rank) != 0; }
  // Nonce of this worker's own segment (valid after open()).
  uint64_t segment_nonce() const { return own_ ? own_->nonce() : 0; }
  bool is_peer(const Connection* c) const;

  // A slot of len bytes in this worker's segment holding one reference, else
  // a private buffer from pool (none without a pool: an empty payload).
  Payload stage(size_t len, BufferPool* pool);
  // A slot in a local segment (this worker's or a peer's).
  Payload resolve(uint32_t segment, uint64_t offset, uint64_t len) const override;

 private:
  std::shared_ptr<ShmSegment> segment_of(uint32_t rank) const;

  LocalGroupOptions opts_;
  int listen_fd_ = -1;
  std::unique_ptr<JobClaim> claim_;  // this job id and rank are ours on this host
  std::shared_ptr<ShmSegment> own_;
  std::unique_ptr<ShmArena> arena_;
  bool own_unlinked_ = false;
  std::unordered_map<uint32_t, std::shared_ptr<ShmSegment>> peers_seg_;
  std::unordered_map<uint32_t, Link> peers_;
};

}  // namespace fastps
