// TCP transport: an epoll loop thread that receives frames straight into
// memory the owner chooses, and connections whose sends are scatter-gather
// (header + caller's memory, no copy) with a queue drained by the loop.
#pragma once
#include <sys/uio.h>

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "transport/handshake.h"
#include "transport/wire.h"

namespace fastps {

class Connection;

// Implemented by the server engine and the worker. Called on the loop thread.
class FrameHandler {
 public:
  virtual ~FrameHandler() = default;
  // A header arrived; return where its hdr.len payload bytes go. Return nullptr
  // with *why set to reject the frame, which closes this connection only.
  virtual void* on_header(Connection* c, const FrameHeader& h, std::string* why) = 0;
  // The whole payload is in place.
  virtual void on_frame(Connection* c, const FrameHeader& h, void* payload) = 0;
  // The connection is gone. clean is true after the peer said kBye.
  virtual void on_close(Connection* c, bool clean, const std::string& reason) = 0;
};

class Connection {
 public:
  Connection(int fd, Peer peer, std::string desc, FrameHandler* handler);
  ~Connection();

  // Queues header + payload; the payload memory must stay valid until on_sent
  // runs (or the connection dies, in which case on_sent is dropped unrun).
  // Returns false if the connection is already closed.
  bool send(const FrameHeader& h, const void* payload, size_t len,
            std::function<void()> on_sent = nullptr);
  // Queues a frame with no payload ahead of every queued frame not yet started (a
  // control message that must not wait behind megabytes of answers).
  bool send_first(const FrameHeader& h);
  const Peer& peer() const { return peer_; }
  const std::string& desc() const { return desc_; }
  bool closed() const { return closed_.load(); }
  // The socket, open for as long as this object lives (for socket options only).
  int fd() const { return fd_; }
  // True when nothing is waiting to be written.
  bool idle() {
    std::lock_guard<std::mutex> lock(send_mu_);
    return sendq_.empty();
  }
  // Adds every byte written to / read from the socket to these counters (either may be
  // null). Set before the connection joins its loop.
  void count_bytes(std::atomic<uint64_t>* sent, std::atomic<uint64_t>* received) {
    sent_bytes_ = sent;
    received_bytes_ = received;
  }
  // Owner's slot for the object a frame is being received into.
  std::shared_ptr<void> rx_hold;

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
  Peer peer_;
  std::string desc_;
  FrameHandler* handler_;
  std::atomic<bool> closed_{false};
  bool saw_bye_ = false;
  std::atomic<uint64_t>* sent_bytes_ = nullptr;
  std::atomic<uint64_t>* received_bytes_ = nullptr;

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
  void add(const std::shared_ptr<Connection>& c);
  // Shuts a connection down from any thread; on_close runs on the loop thread.
  void close(Connection* c);

 private:
  void run();
  void drop(Connection* c, bool clean, const std::string& reason);

  std::string name_;
  int epfd_;
  int wakefd_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::unordered_map<Connection*, std::shared_ptr<Connection>> conns_;
};

}  // namespace fastps
