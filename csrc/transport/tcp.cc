#include "transport/tcp.h"

#include <errno.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "common/logging.h"
#include "common/thread_name.h"
#include "transport/socket.h"

namespace fastps {

TcpConnection::TcpConnection(int fd, Peer peer, std::string desc, FrameHandler* handler)
    : Connection(peer, std::move(desc)), fd_(fd), handler_(handler) {
  set_nonblocking(fd_, true);
}

TcpConnection::~TcpConnection() {
  if (fd_ >= 0) ::close(fd_);
}

void TcpConnection::shutdown_send() { ::shutdown(fd_, SHUT_WR); }

// The loop sees the socket end (EPOLLHUP, or a read of 0) and drops the connection.
void TcpConnection::shutdown_both() { ::shutdown(fd_, SHUT_RDWR); }

void TcpConnection::set_pacing(double bytes_per_s) { set_pacing_rate(fd_, bytes_per_s); }

bool TcpConnection::send(const FrameHeader& h, const void* payload, size_t len,
                         std::function<void()> on_sent) {
  return queue(SendItem{h, payload, len, 0, std::move(on_sent)}, false);
}

bool TcpConnection::send_first(const FrameHeader& h) {
  return queue(SendItem{h, nullptr, 0, 0, nullptr}, true);
}

bool TcpConnection::queue(SendItem item, bool first) {
  std::vector<std::function<void()>> completed;
  bool ok = true;
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    if (closed_.load()) return false;
    auto pos = sendq_.end();
    if (first) {
      pos = sendq_.begin();
      if (pos != sendq_.end() && pos->done > 0) ++pos;  // a frame half written stays whole
    }
    if (unsent_bytes_)
      unsent_bytes_->fetch_add(static_cast<int64_t>(sizeof(FrameHeader) + item.len),
                               std::memory_order_relaxed);
    sendq_.insert(pos, std::move(item));
    // Only the first queued item writes directly; otherwise the loop (or the
    // writer ahead of us) drains the queue in order.
    if (sendq_.size() == 1 && !want_write_) {
      ok = flush_locked(&completed);
      if (ok && !sendq_.empty()) set_want_write(true);
    }
  }
  for (auto& cb : completed)
    if (cb) cb();
  if (!ok) {
    // The loop sees the error on its next wakeup (EPOLLERR/EPOLLHUP) and closes.
    ::shutdown(fd_, SHUT_RDWR);
  }
  return true;
}

bool TcpConnection::flush_locked(std::vector<std::function<void()>>* completed) {
  constexpr int kMaxIov = 64;
  while (!sendq_.empty()) {
    iovec iov[kMaxIov];
    int n = 0;
    for (auto it = sendq_.begin(); it != sendq_.end() && n + 2 <= kMaxIov; ++it) {
      size_t skip = it->done;
      if (skip < sizeof(FrameHeader)) {
        iov[n++] = {reinterpret_cast<char*>(&it->hdr) + skip, sizeof(FrameHeader) - skip};
        skip = 0;
      } else {
        skip -= sizeof(FrameHeader);
      }
      if (it->len > skip)
        iov[n++] = {const_cast<char*>(static_cast<const char*>(it->payload)) + skip,
                    it->len - skip};
    }
    ssize_t w = ::writev(fd_, iov, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      return false;
    }
    size_t left = static_cast<size_t>(w);
    if (sent_bytes_) sent_bytes_->fetch_add(left, std::memory_order_relaxed);
    if (unsent_bytes_)
      unsent_bytes_->fetch_sub(static_cast<int64_t>(left), std::memory_order_relaxed);
    while (left > 0 && !sendq_.empty()) {
      SendItem& it = sendq_.front();
      size_t total = sizeof(FrameHeader) + it.len;
      size_t take = std::min(left, total - it.done);
      it.done += take;
      left -= take;
      if (it.done == total) {
        completed->push_back(std::move(it.on_sent));
        sendq_.pop_front();
      }
    }
  }
  return true;
}

void TcpConnection::drop_unsent_locked() {
  if (!unsent_bytes_) return;
  int64_t left = 0;
  for (auto& it : sendq_) left += static_cast<int64_t>(sizeof(FrameHeader) + it.len - it.done);
  unsent_bytes_->fetch_sub(left, std::memory_order_relaxed);
}

void TcpConnection::set_want_write(bool on) {
  if (want_write_ == on || epfd_ < 0) {
    want_write_ = on;
    return;
  }
  want_write_ = on;
  epoll_event ev{};
  ev.events = EPOLLIN | (on ? static_cast<uint32_t>(EPOLLOUT) : 0u);
  ev.data.ptr = this;
  epoll_ctl(epfd_, EPOLL_CTL_MOD, fd_, &ev);
}

void TcpConnection::expect_bytes(size_t n) {
  // A wake-up per arriving segment costs a context switch and a short copy each;
  // waiting for a larger piece costs nothing, because the frame is only handed on
  // when whole and the mark never exceeds what the frame still owes. The kernel
  // caps the mark at half the receive buffer and still wakes the reader when its
  // window closes, on FIN and on errors.
  constexpr size_t kMaxLowat = 512 << 10;
  int want = static_cast<int>(std::max<size_t>(1, std::min(n, kMaxLowat)));
  if (want == rx_lowat_) return;
  if (setsockopt(fd_, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof(want)) == 0) rx_lowat_ = want;
}

bool TcpConnection::on_readable(std::string* why, bool* clean) {
  // Bounded so one busy connection cannot starve the others on this loop.
  for (int rounds = 0; rounds < 64; ++rounds) {
    if (!rx_in_payload_) {
      ssize_t n = ::recv(fd_, reinterpret_cast<char*>(&rx_hdr_) + rx_hdr_got_,
                         sizeof(FrameHeader) - rx_hdr_got_, 0);
      if (n == 0) {
        *clean = saw_bye_;
        *why = saw_bye_ ? "closed after bye" : "connection closed by peer";
        return false;
      }
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
          expect_bytes(rx_need());
          return true;
        }
        // A reset after the peer's bye: it closed with our last frames unread. It said it
        // was leaving, so this is its clean exit, not a crash.
        *clean = saw_bye_ && errno == ECONNRESET;
        *why = std::string("receive failed: ") + strerror(errno) + (*clean ? " (after bye)" : "");
        return false;
      }
      rx_hdr_got_ += static_cast<size_t>(n);
      if (received_bytes_) received_bytes_->fetch_add(n, std::memory_order_relaxed);
      if (rx_hdr_got_ < sizeof(FrameHeader)) continue;
      rx_hdr_got_ = 0;
      // The transport's own fields; receivers check the application's fields in
      // on_header (protocol/frame_check), for every frame length.
      if (rx_hdr_.magic != kFrameMagic || rx_hdr_.len > kMaxPartBytes) {
        *why = "malformed frame (bad magic or a length over the part limit)";
        return false;
      }
      if (rx_hdr_.type == kFrameBye) {
        saw_bye_ = true;
        continue;
      }
      rx_len_ = payload_bytes(rx_hdr_);
      rx_dst_ = static_cast<char*>(handler_->on_header(this, rx_hdr_, why));
      // A rejection (why set) closes the connection even when no payload follows.
      if (!why->empty()) return false;
      if (!rx_dst_ && rx_len_ > 0) {
        *why = "frame of type " + std::to_string(rx_hdr_.type) + " has nowhere to go";
        return false;
      }
      rx_got_ = 0;
      if (rx_len_ == 0) {
        handler_->on_frame(this, rx_hdr_, rx_dst_);
        continue;
      }
      rx_in_payload_ = true;
    }
    ssize_t n = ::recv(fd_, rx_dst_ + rx_got_, rx_len_ - rx_got_, 0);
    if (n == 0) {
      *why = "connection closed by peer in the middle of a frame";
      return false;
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        expect_bytes(rx_need());
        return true;
      }
      *why = std::string("receive failed: ") + strerror(errno);
      return false;
    }
    rx_got_ += static_cast<size_t>(n);
    if (received_bytes_) received_bytes_->fetch_add(n, std::memory_order_relaxed);
    if (rx_got_ == rx_len_) {
      rx_in_payload_ = false;
      handler_->on_frame(this, rx_hdr_, rx_dst_);
    }
  }
  // Out of rounds with bytes still in the socket: the mark must not exceed what is
  // owed now, or a level-triggered wait could miss the rest of a short frame.
  expect_bytes(rx_need());
  return true;
}

EventLoop::EventLoop(std::string name) : name_(std::move(name)) {
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  wakefd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epfd_ < 0 || wakefd_ < 0) throw std::runtime_error("epoll/eventfd creation failed");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;
  epoll_ctl(epfd_, EPOLL_CTL_ADD, wakefd_, &ev);
}

EventLoop::~EventLoop() {
  stop();
  ::close(epfd_);
  ::close(wakefd_);
}

void EventLoop::start() {
  thread_ = std::thread([this] {
    name_this_thread(name_);
    thread_id_.store(std::this_thread::get_id());
    run();
  });
}

void EventLoop::stop() {
  if (stop_.exchange(true)) {
    if (thread_.joinable()) thread_.join();
    return;
  }
  uint64_t one = 1;
  (void)!::write(wakefd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& kv : conns_) {
    std::lock_guard<std::mutex> sl(kv.first->send_mu_);
    kv.first->closed_ = true;
    kv.first->drop_unsent_locked();
    kv.first->sendq_.clear();
  }
  conns_.clear();
}

void EventLoop::add(const std::shared_ptr<TcpConnection>& c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    conns_[c.get()] = c;
  }
  std::lock_guard<std::mutex> sl(c->send_mu_);
  c->epfd_ = epfd_;
  epoll_event ev{};
  ev.events = EPOLLIN | (c->want_write_ ? static_cast<uint32_t>(EPOLLOUT) : 0u);
  ev.data.ptr = c.get();
  epoll_ctl(epfd_, EPOLL_CTL_ADD, c->fd_, &ev);
}

void EventLoop::drop(TcpConnection* c, bool clean, const std::string& reason) {
  std::shared_ptr<TcpConnection> keep;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = conns_.find(c);
    if (it == conns_.end()) return;
    keep = it->second;
    conns_.erase(it);
  }
  epoll_ctl(epfd_, EPOLL_CTL_DEL, c->fd_, nullptr);
  {
    std::lock_guard<std::mutex> sl(c->send_mu_);
    c->closed_ = true;
    c->drop_unsent_locked();
    c->sendq_.clear();
  }
  c->handler_->on_close(c, clean, reason);
}

void EventLoop::restart_stuck_connections() {
  // Two timeouts in a row: the path was gone for about a second (the backoff is capped at
  // 1 s, socket.cc); at most one restart per connection every 2 s.
  constexpr int kMinBackoff = 2;
  constexpr auto kAgain = std::chrono::seconds(2);
  auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& kv : conns_) {
    TcpConnection* c = kv.first;
    if (now < c->cc_restart_after_) continue;
    if (!restart_stuck_congestion_control(c->fd_, kMinBackoff)) continue;
    c->cc_restart_after_ = now + kAgain;
    cc_restarts_.fetch_add(1, std::memory_order_relaxed);
    LOG_DEBUG(name_ << ": restarted the congestion control of " << c->desc()
                    << " after repeated retransmission timeouts");
  }
}

void EventLoop::run() {
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  constexpr auto kCheckEvery = std::chrono::milliseconds(250);
  auto next_check = std::chrono::steady_clock::now() + kCheckEvery;
  while (!stop_.load()) {
    auto now = std::chrono::steady_clock::now();
    if (now >= next_check) {
      restart_stuck_connections();
      next_check = now + kCheckEvery;
    }
    int wait_ms =
        static_cast<int>(
            std::chrono::duration_cast<std::chrono::milliseconds>(next_check - now).count()) +
        1;
    int n = epoll_wait(epfd_, events, kMaxEvents, wait_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      LOG_ERROR(name_ << ": epoll_wait failed: " << strerror(errno));
      break;
    }
    for (int i = 0; i < n && !stop_.load(); ++i) {
      auto* c = static_cast<TcpConnection*>(events[i].data.ptr);
      if (!c) continue;  // wakeup
      uint32_t ev = events[i].events;
      std::string why;
      bool clean = false;
      if (ev & EPOLLIN) {
        if (!c->on_readable(&why, &clean)) {
          drop(c, clean, why);
          continue;
        }
      }
      if (ev & EPOLLOUT) {
        std::vector<std::function<void()>> completed;
        bool ok;
        {
          std::lock_guard<std::mutex> sl(c->send_mu_);
          ok = c->flush_locked(&completed);
          if (ok && c->sendq_.empty()) c->set_want_write(false);
        }
        for (auto& cb : completed)
          if (cb) cb();
        if (!ok) {
          drop(c, false, std::string("send failed: ") + strerror(errno));
          continue;
        }
      }
      if ((ev & (EPOLLERR | EPOLLHUP)) && !(ev & EPOLLIN)) {
        drop(c, c->saw_bye_, "connection error or hangup");
      }
    }
  }
}

}  // namespace fastps
