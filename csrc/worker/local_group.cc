#include "worker/local_group.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "common/errors.h"
#include "common/logging.h"
#include "transport/handshake.h"
#include "transport/socket.h"

namespace fastps {

namespace {
std::string socket_name(const std::string& job_id, uint32_t rank) {
  return "fastps-" + job_id + "-lw" + std::to_string(rank);
}
}  // namespace

LocalGroup::LocalGroup(LocalGroupOptions opts) : opts_(std::move(opts)) {
  if (opts_.local_ranks.empty()) opts_.local_ranks.push_back(opts_.rank);
  std::sort(opts_.local_ranks.begin(), opts_.local_ranks.end());
  if (!std::binary_search(opts_.local_ranks.begin(), opts_.local_ranks.end(), opts_.rank))
    throw std::invalid_argument("local_ranks must include this worker's rank " +
                                std::to_string(opts_.rank));
}

LocalGroup::~LocalGroup() {
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (!own_unlinked_ && own_) ShmSegment::unlink(own_->name());
}

void LocalGroup::open() {
  claim_ = std::make_unique<JobClaim>(opts_.job_id, opts_.rank);
  own_ = ShmSegment::create(shm_segment_name(opts_.job_id, opts_.rank), opts_.shm_bytes);
  arena_ = std::make_unique<ShmArena>(own_);
  if (size() > 1) listen_fd_ = unix_listen(socket_name(opts_.job_id, opts_.rank));
}

std::vector<std::shared_ptr<TcpConnection>> LocalGroup::connect_peers(FrameHandler* handler) {
  std::vector<std::shared_ptr<TcpConnection>> out;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(opts_.timeout_s);
  auto left = [&] {
    return std::max(
        0.0, std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count());
  };
  // After the handshake each side announces its segment's nonce, maps the
  // other's segment (checking the nonce: it is this run's, not a namesake's)
  // and says so with one byte, so both know their segment is reachable before
  // any part moves.
  auto finish = [&](int fd, uint32_t peer) {
    uint64_t mine = own_->nonce(), nonce = 0;
    if (!write_full(fd, &mine, sizeof(mine), left()) ||
        !read_full(fd, &nonce, sizeof(nonce), left()))
      throw std::runtime_error("local worker " + std::to_string(peer) +
                               " did not announce its shared memory");
    auto seg = ShmSegment::open(shm_segment_name(opts_.job_id, peer), nonce);
    uint8_t mapped = 1, theirs = 0;
    if (!write_full(fd, &mapped, 1, left()) || !read_full(fd, &theirs, 1, left()) || theirs != 1)
      throw std::runtime_error("local worker " + std::to_string(peer) +
                               " did not map this worker's shared memory");
    peers_seg_[peer] = std::move(seg);
    Peer p;
    p.rank = peer;
    auto c =
        std::make_shared<TcpConnection>(fd, p, "local worker " + std::to_string(peer), handler);
    peers_[peer] = Link(c, true);
    out.push_back(c);
  };
  auto check = [&] {
    std::string why = opts_.cancelled ? opts_.cancelled() : std::string();
    if (!why.empty()) throw AbortError(why);
  };
  for (uint32_t r : opts_.local_ranks) {
    if (r >= opts_.rank) break;
    int fd = -1;
    while (fd < 0) {  // in short slices, watching for an abort
      check();
      try {
        fd = unix_connect(socket_name(opts_.job_id, r), std::min(left(), 0.2));
      } catch (const std::runtime_error&) {
        if (left() <= 0) throw;
      }
    }
    try {
      connect_handshake(fd, opts_.job_id, opts_.token, opts_.rank, 0, left(),
                        "local worker " + std::to_string(r));
      finish(fd, r);
    } catch (...) {
      ::close(fd);
      throw;
    }
  }
  size_t higher = static_cast<size_t>(
      opts_.local_ranks.end() -
      std::upper_bound(opts_.local_ranks.begin(), opts_.local_ranks.end(), opts_.rank));
  while (higher > 0) {
    check();
    pollfd p{listen_fd_, POLLIN, 0};
    int ms = static_cast<int>(std::min(left(), 0.2) * 1000);
    if (ms <= 0 || ::poll(&p, 1, ms) <= 0) {
      if (left() > 0) continue;
      throw TimeoutError("worker " + std::to_string(opts_.rank) + ": " + std::to_string(higher) +
                         " local worker(s) did not connect within the timeout");
    }
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Peer peer;
    std::string why;
    if (!accept_handshake(fd, opts_.job_id, opts_.token, opts_.num_workers, left(), &peer, &why) ||
        peer.rank <= opts_.rank ||
        !std::binary_search(opts_.local_ranks.begin(), opts_.local_ranks.end(), peer.rank) ||
        peers_.count(peer.rank)) {
      LOG_WARN("worker " << opts_.rank << ": refused local connection: "
                         << (why.empty() ? "not an expected local worker" : why));
      ::close(fd);
      continue;
    }
    try {
      finish(fd, peer.rank);
    } catch (...) {
      ::close(fd);
      throw;
    }
    --higher;
  }
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    listen_fd_ = -1;
  }
  return out;
}

void LocalGroup::unlink_own() {
  if (own_ && !own_unlinked_) ShmSegment::unlink(own_->name());
  own_unlinked_ = true;
}

void LocalGroup::unlink_all() {
  if (!claim_) return;  // never ours: the names may be another job's
  for (uint32_t r : opts_.local_ranks) ShmSegment::unlink(shm_segment_name(opts_.job_id, r));
  own_unlinked_ = true;
}

uint32_t LocalGroup::owner(uint64_t tensor, uint32_t part) const {
  // Consecutive parts of a tensor go to consecutive local workers; the tensor
  // id picks where the walk starts, so single-part tensors spread too.
  uint64_t start = ((tensor * 0x9E3779B97F4A7C15ull) >> 33) % size();
  return opts_.local_ranks[(start + part) % size()];
}

const Link& LocalGroup::peer(uint32_t rank) const { return peers_.at(rank); }

bool LocalGroup::is_peer(const Connection* c) const {
  auto it = peers_.find(c->peer().rank);
  return it != peers_.end() && it->second.connection() == c;
}

std::shared_ptr<ShmSegment> LocalGroup::segment_of(uint32_t rank) const {
  if (rank == opts_.rank) return own_;
  auto it = peers_seg_.find(rank);
  return it == peers_seg_.end() ? nullptr : it->second;
}

Payload LocalGroup::stage(size_t len, BufferPool* pool) {
  int64_t off = arena_ ? arena_->alloc(len) : -1;
  if (off >= 0) return Payload::slot(own_, opts_.rank, static_cast<uint64_t>(off), len);
  if (!pool) return Payload{};
  auto buf = pool->get(len);
  void* data = buf->data();
  return Payload::memory(data, len, std::move(buf));
}

Payload LocalGroup::resolve(uint32_t segment, uint64_t offset, uint64_t len) const {
  auto seg = segment_of(segment);
  if (!seg || !seg->contains(offset, len)) return Payload{};
  return Payload::slot(std::move(seg), segment, offset, len);
}

}  // namespace fastps
