#include "server/server.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <sstream>
#include <stdexcept>

#include "common/dtype.h"
#include "common/logging.h"
#include "common/thread_name.h"
#include "common/trace.h"
#include "protocol/frame_check.h"
#include "transport/handshake.h"
#include "transport/link.h"
#include "transport/socket.h"

namespace fastps {

Server::Server(ServerOptions opts) : opts_(std::move(opts)) {
  check_options(opts_);
  pool_ = std::make_shared<BufferPool>();
}

Server::~Server() { stop(); }

int Server::start() {
  int port = 0;
  listen_fd_ = tcp_listen(opts_.host, opts_.port, &port);
  relay_ = std::make_unique<RackRelay>(
      opts_.server_id, opts_.job_id, opts_.token, opts_.handshake_timeout_s,
      [this](const FrameHeader& h, Payload p) {
        PushWork w;
        w.hdr = h;
        w.data = std::move(p);
        engines_[(part_key(h.tensor, h.part) >> 7) % engines_.size()]->post(std::move(w));
      },
      [this](const std::string& m) { fatal(m); });
  // engine_threads 0: one engine that sums on the thread that received the part.
  for (int i = 0; i < std::max(1, opts_.engine_threads); ++i) {
    EngineRules rules;
    rules.quorum = opts_.round_quorum;
    rules.quorum_fraction = opts_.round_quorum_fraction;
    rules.quorum_history = opts_.quorum_history;
    rules.staleness = opts_.staleness;
    rules.nudge = opts_.nudge;
    rules.nudge_overdue_us = opts_.nudge_overdue_us;
    engines_.push_back(std::make_unique<SumEngine>(i, opts_.num_workers, opts_.server_id, rules));
    engines_.back()->set_error_broadcast(
        [this](const FrameHeader& h, const std::string& m) { broadcast(MsgType::kError, h, m); });
    engines_.back()->set_relay(relay_.get(), [this](const std::string& m) { fatal(m); });
    engines_.back()->start(opts_.engine_threads > 0);
  }
  for (int i = 0; i < opts_.io_threads; ++i) {
    loops_.push_back(std::make_unique<EventLoop>("server-io-" + std::to_string(i)));
    loops_.back()->start();
  }
  acceptor_ = std::thread([this] {
    name_this_thread("fastps-accept");
    accept_loop();
  });
  LOG_INFO("server " << opts_.server_id << " listening on " << opts_.host << ":" << port);
  return port;
}

void Server::stop() {
  if (stopping_.exchange(true)) return;
  if (acceptor_.joinable()) acceptor_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (relay_) relay_->stop();
  for (auto& l : loops_) l->stop();
  for (auto& e : engines_) e->stop();
  std::lock_guard<std::mutex> lock(mu_);
  conns_.clear();
  // Normally the workers unlinked their segments long ago; after a crash this is
  // the survivors' clean-up (unlinking a missing name is harmless).
  for (auto& kv : shm_) ShmSegment::unlink(kv.second->name());
  shm_.clear();
}

std::string Server::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

uint64_t Server::late_pushes() const {
  uint64_t n = 0;
  for (auto& e : engines_) n += e->late_pushes();
  return n;
}

uint64_t Server::nudges() const {
  uint64_t n = 0;
  for (auto& e : engines_) n += e->nudges();
  return n;
}

uint64_t Server::fetched_rounds() const {
  uint64_t n = 0;
  for (auto& e : engines_) n += e->fetched_rounds();
  return n;
}

uint64_t Server::parts_summed() const {
  uint64_t n = 0;
  for (auto& e : engines_) n += e->parts_summed();
  return n;
}

void Server::accept_loop() {
  // Handshakes run side by side, each with its own deadline; when too many are
  // under way the oldest is turned away with a busy marker (the worker retries),
  // so silent or slow peers cannot hold up a legitimate one.
  std::deque<ServerHandshake> pending;
  std::vector<pollfd> fds;
  auto now_s = [] {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
  };
  auto refuse = [&](const ServerHandshake& hs, const std::string& why) {
    refused_++;
    LOG_WARN("server " << opts_.server_id << ": refused connection from " << peer_name(hs.fd())
                       << ": " << why);
    ::close(hs.fd());
  };
  set_nonblocking(listen_fd_, true);
  while (!stopping_.load()) {
    fds.assign(1, pollfd{listen_fd_, POLLIN, 0});
    for (auto& hs : pending) fds.push_back(pollfd{hs.fd(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR) break;
    double now = now_s();
    std::deque<ServerHandshake> still;
    for (size_t i = 0; i < pending.size(); ++i) {
      ServerHandshake& hs = pending[i];
      auto st = ServerHandshake::State::kPending;
      if (fds[i + 1].revents) st = hs.on_readable(opts_.job_id, opts_.token, opts_.num_workers);
      if (st == ServerHandshake::State::kDone) {
        admit(hs.fd(), hs.peer());
      } else if (st == ServerHandshake::State::kFailed) {
        refuse(hs, hs.why());
      } else if (now > hs.deadline()) {
        refuse(hs, "no valid hello within " + std::to_string(opts_.handshake_timeout_s) + " s");
      } else {
        still.push_back(std::move(hs));
      }
    }
    pending.swap(still);
    if (!(fds[0].revents & POLLIN)) continue;
    while (true) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) break;
      tune_socket(fd);
      if (pending.size() >= static_cast<size_t>(opts_.max_pending_handshakes)) {
        refuse_busy(pending.front().fd());
        refuse(pending.front(), "too many handshakes under way; the oldest is turned away");
        pending.pop_front();
      }
      pending.emplace_back(fd, now + opts_.handshake_timeout_s);
      if (!pending.back().why().empty()) {
        refuse(pending.back(), pending.back().why());
        pending.pop_back();
      }
    }
  }
  for (auto& hs : pending) ::close(hs.fd());
}

void Server::admit(int fd, const Peer& peer) {
  std::string who = peer_name(fd);
  std::ostringstream desc;
  bool relay = peer.conn_index & kRelayConnBit;
  if (relay)
    desc << "rack server " << (peer.conn_index & ~kRelayConnBit) << " (relaying as worker "
         << peer.rank << ", " << who << ")";
  else
    desc << "worker " << peer.rank << " (" << who << ")";
  auto conn = std::make_shared<TcpConnection>(fd, peer, desc.str(), this);
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Pacing is per worker; a rack's relay carries that whole rack's sums at its own rate.
    if (!pacing_.empty() || !relay_pacing_.empty()) {
      double rate = relay ? pacing_of(peer) : worker_rate_locked(peer);
      if (rate >= 0) set_pacing_rate(fd, rate);
    }
    if (!relay) conn->count_unsent(&answers_unsent_);
    conns_.push_back(conn);
  }
  loops_[next_loop_++ % loops_.size()]->add(conn);
  LOG_DEBUG("server " << opts_.server_id << ": accepted " << desc.str() << " conn "
                      << peer.conn_index);
}

double Server::pacing_of(const Peer& peer) const {
  if (peer.conn_index & kRelayConnBit) {
    uint32_t id = peer.conn_index & ~kRelayConnBit;
    return id < relay_pacing_.size() ? relay_pacing_[id] : 0.0;
  }
  return peer.rank < pacing_.size() ? pacing_[peer.rank] : 0.0;
}

double Server::worker_rate_locked(const Peer& peer) {
  double cap = pacing_of(peer);
  if (!(cap > 0) || burst_bytes_.load() == 0) return cap;
  if (!burst_.load()) {
    paced_ = true;
    return cap;
  }
  // In a burst: the link rate once the caps were ever set, else not paced at all (a socket
  // Linux paces stays paced, at the lower of our rate and its own estimate).
  return paced_ ? std::max(cap, burst_rate_) : -1;
}

void Server::set_pacing(std::vector<double> per_rank) {
  std::lock_guard<std::mutex> lock(mu_);
  pacing_ = std::move(per_rank);
  for (auto& c : conns_) {
    if (c->peer().conn_index & kRelayConnBit) continue;
    double rate = worker_rate_locked(c->peer());
    if (rate >= 0) c->set_pacing(rate);
  }
}

void Server::set_pacing_burst(size_t bytes, double bytes_per_s) {
  std::lock_guard<std::mutex> lock(mu_);
  burst_rate_ = bytes_per_s > 0 ? bytes_per_s : 0;
  burst_bytes_.store(burst_rate_ > 0 ? bytes : 0);
  burst_.store(burst_rate_ > 0 && bytes > 0);  // unpaced until the first large backlog
}

// The caps split this host's link among the flows that send at once. A backlog of answers
// below burst_bytes_ is one short burst, answered after the pushes it sums arrived, so the
// caps would leave the link partly idle: the answers go at the link's rate then (or stay
// unpaced until the first large backlog). Only a change of state takes mu_ and costs a
// setsockopt per connection.
void Server::pace_for_backlog() {
  size_t limit = burst_bytes_.load(std::memory_order_relaxed);
  if (limit == 0) return;
  bool burst = answers_unsent_.load(std::memory_order_relaxed) < static_cast<int64_t>(limit);
  if (burst == burst_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (burst == burst_.load()) return;
  burst_.store(burst);
  for (auto& c : conns_) {
    if (c->peer().conn_index & kRelayConnBit) continue;
    double rate = worker_rate_locked(c->peer());
    if (rate > 0) c->set_pacing(rate);
  }
  pacing_switches_.fetch_add(1, std::memory_order_relaxed);
}

void Server::set_rack_pacing(std::vector<double> answers_by_relay_id,
                             std::vector<double> up_by_owner) {
  if (!relay_) throw std::logic_error("set_rack_pacing before start");
  relay_->set_pacing(std::move(up_by_owner));
  std::lock_guard<std::mutex> lock(mu_);
  relay_pacing_ = std::move(answers_by_relay_id);
  for (auto& c : conns_)
    if (c->peer().conn_index & kRelayConnBit) c->set_pacing(pacing_of(c->peer()));
}

void Server::set_rack_route(std::vector<std::string> owners, std::vector<uint32_t> owner_ids,
                            uint32_t rank, std::string rack) {
  if (!relay_) throw std::logic_error("set_rack_route before start");
  if (rank >= opts_.num_workers)
    throw std::invalid_argument("rack route: relay rank " + std::to_string(rank) +
                                " is not a rank of the job's " + std::to_string(opts_.num_workers) +
                                " workers");
  RackRoute route;
  route.owners = std::move(owners);
  route.owner_ids = std::move(owner_ids);
  route.rank = rank;
  route.rack = std::move(rack);
  relay_->configure(std::move(route));
}

void Server::fatal(const std::string& msg) {
  LOG_WARN("server " << opts_.server_id << ": " << msg);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) error_ = msg;
  }
  FrameHeader h{};
  broadcast(MsgType::kFatal, h, msg);
}

Payload Server::resolve(uint32_t segment, uint64_t offset, uint64_t len) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = shm_.find(segment);
  if (it == shm_.end() || !it->second->contains(offset, len)) return Payload{};
  return Payload::slot(it->second, segment, offset, len);
}

std::shared_ptr<Connection> Server::find(Connection* c) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& p : conns_)
    if (p.get() == c) return p;
  return nullptr;
}

void* Server::on_header(Connection* c, const FrameHeader& h, std::string* why) {
  if (!check_server_frame(h, c->peer().rank, opts_.num_workers, why)) {
    // The connection closes; on_close logs and reports it with the peer's name.
    *why = "malformed frame (" + *why + ")";
    return nullptr;
  }
  if (h.type == static_cast<uint8_t>(MsgType::kShmAttach)) return nullptr;
  trace::mark(trace::Mark::kPushHeader, h.tensor, h.part, c->peer().rank, h.len);
  if (payload_bytes(h) == 0 && h.len > 0) return nullptr;  // a slot reference
  auto buf = pool_->get(h.len);
  void* dst = buf->data();
  c->rx_hold = std::move(buf);
  return dst;
}

void Server::attach_shm(Connection* c, const FrameHeader& h) {
  auto conn = find(c);
  if (!conn) return;
  FrameHeader r{};
  r.magic = kFrameMagic;
  r.type = static_cast<uint8_t>(MsgType::kShmAttached);
  r.sender = opts_.server_id;
  // The name is derived from the job and the authenticated rank, never taken
  // from the frame, so a worker can only hand over its own segment.
  std::string name = shm_segment_name(opts_.job_id, c->peer().rank);
  try {
    // The worker announced its segment's nonce in shm_offset.
    auto seg = ShmSegment::open(name, h.shm_offset);
    std::lock_guard<std::mutex> lock(mu_);
    shm_[c->peer().rank] = std::move(seg);
  } catch (const std::exception& e) {
    auto text = std::make_shared<std::string>(e.what());
    r.len = text->size();
    conn->send(r, text->data(), text->size(), [text] {});
    return;
  }
  conn->send(r, nullptr, 0);
}

void Server::on_frame(Connection* c, const FrameHeader& h, void* payload) {
  if (h.type == static_cast<uint8_t>(MsgType::kShmAttach)) {
    attach_shm(c, h);
    return;
  }
  PushWork w;
  w.conn = find(c);
  w.hdr = h;
  if (!w.conn) return;
  trace::mark(trace::Mark::kPushReceived, h.tensor, h.part, c->peer().rank, h.len);
  // A slot may lie in any colocated worker's segment: a local reduce leaves a
  // part's sum in the segment of one of the host's workers, not always the pusher's.
  w.data = received_payload(h, payload, std::move(c->rx_hold), this);
  if (refers_to_slot(h) && !w.data.in_slot()) {
    LOG_WARN("server " << opts_.server_id << ": " << c->desc()
                       << " pushed a shared-memory part outside the mapped segments; closing");
    c->shutdown_both();
    return;
  }
  uint64_t key = part_key(h.tensor, h.part);
  engines_[(key >> 7) % engines_.size()]->post(std::move(w));
  pace_for_backlog();
}

void Server::broadcast(MsgType type, const FrameHeader& about, const std::string& msg) {
  std::vector<std::shared_ptr<Connection>> targets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // One connection per worker, and one per rack relay (it relays to its rack's workers).
    std::vector<bool> seen(opts_.num_workers, false);
    std::vector<uint32_t> relays_seen;
    for (auto& c : conns_) {
      if (c->closed()) continue;
      if (c->peer().conn_index & kRelayConnBit) {
        uint32_t id = c->peer().conn_index;
        if (std::find(relays_seen.begin(), relays_seen.end(), id) != relays_seen.end()) continue;
        relays_seen.push_back(id);
      } else {
        if (seen[c->peer().rank]) continue;
        seen[c->peer().rank] = true;
      }
      targets.push_back(c);
    }
  }
  auto text = std::make_shared<std::string>(msg);
  FrameHeader h = about;
  h.magic = kFrameMagic;
  h.flags = 0;
  h.type = static_cast<uint8_t>(type);
  h.sender = opts_.server_id;
  h.len = text->size();
  for (auto& c : targets) c->send(h, text->data(), text->size(), [text] {});
}

void Server::on_close(Connection* c, bool clean, const std::string& reason) {
  std::shared_ptr<Connection> keep;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(conns_.begin(), conns_.end(),
                           [c](const std::shared_ptr<Connection>& p) { return p.get() == c; });
    if (it != conns_.end()) {
      keep = *it;
      conns_.erase(it);
    }
  }
  if (clean || stopping_.load() || opts_.worker_may_reconnect) return;
  std::ostringstream os;
  os << c->desc() << " disconnected from server " << opts_.server_id << ": " << reason;
  fatal(os.str());
}

}  // namespace fastps
