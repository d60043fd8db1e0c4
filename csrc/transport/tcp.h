// TCP transport: an epoll loop thread that receives frames straight into
// memory the owner chooses, and connections (transport/connection.h) whose sends
// are scatter-gather (header + caller's memory, no copy) with a queue drained by
// the loop.
#pragma once
#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "transport/connection.h"
#include "transport/handshake.h"
#include "transport/wire.h"

namespace fastps {

// A connection over a stream socket (TCP, or a local socket between the workers of one
// host): sends are queued and written by the caller or the loop, receives go straight
// into the memory the handler picks.
class TcpConnection final : public Connection {
 public:
  TcpConnection(int fd, Peer peer, std::string desc, FrameHandler* handler);
  ~TcpConnection() override;

  bool send(const FrameHeader& h, const void* payload, size_t len,
            std::function<void()> on_sent = nullptr) override;
  bool send_first(const FrameHeader& h) override;
  bool closed() const override { return closed_.load(); }
  bool idle() override {
    std::lock_guard<std::mutex> lock(send_mu_);
    return sendq_.empty();
  }
  void shutdown_send() override;
  void shutdown_both() override;
  void set_pacing(double bytes_per_s) override;
  void count_bytes(std::atomic<uint64_t>* sent, std::atomic<uint64_t>* received) override {
    sent_bytes_ = sent;
    received_bytes_ = received;
  }
  void count_unsent(std::atomic<int64_t>* unsent) override { unsent_bytes_ = unsent; }
  // The socket, open for as long as this object lives (for socket options only).
  int fd() const { return fd_; }

 private:
  friend class EventLoop;
  struct SendItem {
    FrameHeader hdr;
    const void* payload;
    size_t len;
    size_t done;  // bytes of header+payload already written
    std::function<void()> on_sent;
  };
  // send and send_first: queues item (at the back, or ahead of every frame not yet
  // started) and writes at once when the queue was empty.
  bool queue(SendItem item, bool first);
  // Writes as much as the socket takes; collects completed callbacks.
  // Returns false on a fatal socket error. Caller holds send_mu_.
  bool flush_locked(std::vector<std::function<void()>>* completed);
  // Reads what is available; returns false when the connection must close.
  bool on_readable(std::string* why, bool* clean);
  void set_want_write(bool on);

  int fd_;
  int epfd_ = -1;
  FrameHandler* handler_;
  std::atomic<bool> closed_{false};
  bool saw_bye_ = false;
  std::atomic<uint64_t>* sent_bytes_ = nullptr;
  std::atomic<uint64_t>* received_bytes_ = nullptr;
  std::atomic<int64_t>* unsent_bytes_ = nullptr;
  // Takes the unwritten rest of every queued frame off *unsent_bytes_ (send_mu_ held,
  // before sendq_ is cleared).
  void drop_unsent_locked();

  std::mutex send_mu_;
  std::deque<SendItem> sendq_;
  bool want_write_ = false;

  // Receive state, touched only by the loop thread.
  FrameHeader rx_hdr_{};
  size_t rx_hdr_got_ = 0;
  char* rx_dst_ = nullptr;
  size_t rx_got_ = 0;
  size_t rx_len_ = 0;  // payload bytes of the frame being received
  bool rx_in_payload_ = false;
  int rx_lowat_ = 1;  // the socket's SO_RCVLOWAT as last set
  // The loop may restart this connection's congestion control again from then on
  // (EventLoop::restart_stuck_connections; loop thread only).
  std::chrono::steady_clock::time_point cc_restart_after_{};
  // Before waiting: the loop wakes only when the rest of the header, or of the
  // payload up to a cap, is in the socket (see on_readable).
  void expect_bytes(size_t n);
  size_t rx_need() const {
    return rx_in_payload_ ? rx_len_ - rx_got_ : sizeof(FrameHeader) - rx_hdr_got_;
  }
};

class EventLoop {
 public:
  explicit EventLoop(std::string name);
  ~EventLoop();
  void start();
  void stop();
  void add(const std::shared_ptr<TcpConnection>& c);
  // Congestion-control restarts so far (restart_stuck_connections).
  uint64_t congestion_restarts() const { return cc_restarts_.load(std::memory_order_relaxed); }
  // Whether the caller is this loop's thread (its frame and send callbacks run there).
  bool on_loop_thread() const { return std::this_thread::get_id() == thread_id_.load(); }

 private:
  void run();
  // Every connection with data in flight that sat through repeated retransmission
  // timeouts measures its path afresh (socket.h restart_stuck_congestion_control).
  void restart_stuck_connections();
  void drop(TcpConnection* c, bool clean, const std::string& reason);

  std::string name_;
  int epfd_;
  int wakefd_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> cc_restarts_{0};
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};  // the loop thread's, once it runs
  std::mutex mu_;
  std::unordered_map<TcpConnection*, std::shared_ptr<TcpConnection>> conns_;
};

}  // namespace fastps
