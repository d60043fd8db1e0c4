#include "server/rack_relay.h"

#include <chrono>
#include <sstream>
#include <thread>

#include "common/logging.h"
#include "protocol/frame_check.h"
#include "protocol/messages.h"
#include "transport/handshake.h"
#include "transport/link.h"
#include "transport/socket.h"

namespace fastps {

RackRelay::RackRelay(uint32_t server_id, std::string job_id, std::string token, double timeout_s,
                     Deliver deliver, Fail fail)
    : server_id_(server_id),
      job_id_(std::move(job_id)),
      token_(std::move(token)),
      timeout_s_(timeout_s),
      deliver_(std::move(deliver)),
      fail_(std::move(fail)) {}

RackRelay::~RackRelay() { stop(); }

void RackRelay::configure(RackRoute route) {
  if (route.owners.size() != route.owner_ids.size())
    throw std::invalid_argument("rack route: " + std::to_string(route.owners.size()) +
                                " owner addresses for " + std::to_string(route.owner_ids.size()) +
                                " owner ids");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!conns_.empty()) throw std::logic_error("the rack route is set once, before any relay");
    route_ = std::move(route);
    conns_.assign(route_.owners.size(), nullptr);
    outstanding_.assign(route_.owners.size(), 0);
  }
  configured_cv_.notify_all();
}

bool RackRelay::configured() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !route_.owners.empty();
}

void RackRelay::set_pacing(std::vector<double> per_owner) {
  std::lock_guard<std::mutex> lock(mu_);
  pacing_ = std::move(per_owner);
  for (size_t i = 0; i < conns_.size() && i < pacing_.size(); ++i)
    if (conns_[i]) conns_[i]->set_pacing(pacing_[i]);
}

void RackRelay::stop() {
  std::unique_ptr<EventLoop> loop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    configured_cv_.notify_all();
    loop = std::move(loop_);
    FrameHeader bye{};
    bye.magic = kFrameMagic;
    bye.type = static_cast<uint8_t>(MsgType::kBye);
    bye.sender = route_.rank;
    for (auto& c : conns_)
      if (c) c->send(bye, nullptr, 0);
  }
  if (loop) {
    // Give the byes a moment to leave before the sockets close.
    for (int i = 0; i < 50; ++i) {
      bool idle = true;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto& c : conns_) idle = idle && (!c || c->closed() || c->idle());
      }
      if (idle) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    loop->stop();
  }
  std::lock_guard<std::mutex> lock(mu_);
  conns_.clear();
}

size_t RackRelay::position(Connection* c) const {
  for (size_t i = 0; i < conns_.size(); ++i)
    if (conns_[i].get() == c) return i;
  return conns_.size();
}

std::shared_ptr<Connection> RackRelay::link_to(uint32_t owner_id, std::string* why, size_t* at) {
  std::unique_lock<std::mutex> lock(mu_);
  // The membership reaches workers and servers at once, so a rack's first sums can arrive
  // before this server has set its route from it: wait for the route (bounded).
  if (route_.owners.empty()) {
    ++awaiting_route_;
    configured_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s_),
                            [this] { return stopping_ || !route_.owners.empty(); });
    --awaiting_route_;
  }
  if (stopping_) {
    *why = "the server is stopping";
    return nullptr;
  }
  if (route_.owners.empty()) {
    std::ostringstream os;
    os << "no route to owner server " << owner_id << ": this server was given no rack route within "
       << timeout_s_ << " s (FASTPS_HANDSHAKE_TIMEOUT) of the sum";
    *why = os.str();
    return nullptr;
  }
  size_t pos = route_.owner_ids.size();
  for (size_t i = 0; i < route_.owner_ids.size(); ++i)
    if (route_.owner_ids[i] == owner_id) pos = i;
  if (pos == route_.owner_ids.size()) {
    *why = "no route to owner server " + std::to_string(owner_id);
    return nullptr;
  }
  *at = pos;
  if (conns_[pos]) return conns_[pos];
  // First relay to this owner: connect now (the engine that asks waits; later relays don't).
  std::string desc = "owner server " + std::to_string(owner_id) + " at " + route_.owners[pos];
  int fd;
  try {
    fd = connect_authenticated(route_.owners[pos], job_id_, token_, route_.rank,
                               kRelayConnBit | server_id_, timeout_s_, 0, desc);
  } catch (const std::exception& e) {
    *why = e.what();
    return nullptr;
  }
  if (pos < pacing_.size() && pacing_[pos] > 0) set_pacing_rate(fd, pacing_[pos]);
  if (!loop_) {
    loop_ = std::make_unique<EventLoop>("rack-relay");
    loop_->start();
  }
  Peer p;
  p.rank = owner_id;
  auto conn = std::make_shared<TcpConnection>(fd, p, desc, this);
  conns_[pos] = conn;
  loop_->add(conn);
  return conns_[pos];
}

bool RackRelay::forward(uint32_t owner_id, FrameHeader h, const Payload& sum, std::string* why) {
  size_t pos = 0;
  auto conn = link_to(owner_id, why, &pos);
  if (!conn) return false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    outstanding_[pos]++;
    // The owner authenticated this link as the route's rank and checks every frame's
    // sender against it; the engine summed before the route may have been set.
    h.sender = route_.rank;
  }
  if (!Link(conn, false).send(h, sum)) {
    *why = "the connection to " + conn->desc() + " is closed";
    return false;
  }
  return true;
}

void* RackRelay::on_header(Connection* c, const FrameHeader& h, std::string* why) {
  if (!check_frame_header(h, why)) {
    *why = "malformed frame from " + c->desc() + " (" + *why + ")";
    return nullptr;
  }
  auto type = static_cast<MsgType>(h.type);
  if (type != MsgType::kResult && type != MsgType::kError && type != MsgType::kFatal) {
    *why = "unexpected frame type " + std::to_string(h.type) + " from " + c->desc();
    return nullptr;
  }
  if (h.flags != 0) {
    *why = "an answer with flags " + std::to_string(h.flags) + " from " + c->desc();
    return nullptr;
  }
  auto buf = pool_->get(h.len);
  void* dst = buf->data();
  c->rx_hold = std::move(buf);
  return dst;
}

void RackRelay::on_frame(Connection* c, const FrameHeader& h, void* payload) {
  auto type = static_cast<MsgType>(h.type);
  if (type == MsgType::kFatal) {
    std::string text(static_cast<const char*>(payload), h.len);
    fail_(c->desc() + " ended the job: " + text);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    size_t pos = position(c);
    if (pos < outstanding_.size() && outstanding_[pos] > 0) outstanding_[pos]--;
  }
  deliver_(h, Payload::memory(payload, h.len, std::move(c->rx_hold)));
}

void RackRelay::on_close(Connection* c, bool clean, const std::string& reason) {
  uint64_t waiting = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    size_t pos = position(c);
    if (pos < outstanding_.size()) waiting = outstanding_[pos];
  }
  // Nothing waits on it: the owner may simply have shut down first. A later relay to it
  // fails by name (forward).
  if (waiting == 0) return;
  std::ostringstream os;
  os << "rack server " << server_id_ << " of rack '" << route_.rack << "' lost its uplink to "
     << c->desc() << " with " << waiting << " rack sums unanswered"
     << (clean ? " (closed by the owner)" : "") << ": " << reason;
  fail_(os.str());
}

}  // namespace fastps
