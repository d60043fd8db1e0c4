// A connection to one peer, whatever carries the frames: what the worker, the local
// stage, the server and its engines hold and send on. The TCP connection (transport/tcp.h)
// is one implementation; another transport (RDMA, say) adds its own class and event
// loop beside it, and only the code that connects or accepts (Worker::start, the
// server's accept loop, LocalGroup, RackRelay) names a concrete class.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "transport/handshake.h"
#include "transport/wire.h"

namespace fastps {

class Connection;

// Implemented by the server engine and the worker. Called on the connection's loop thread.
class FrameHandler {
 public:
  virtual ~FrameHandler() = default;
  // A header arrived; return where its payload_bytes(h) bytes go. Return nullptr
  // with *why set to reject the frame, which closes this connection only.
  virtual void* on_header(Connection* c, const FrameHeader& h, std::string* why) = 0;
  // The whole payload is in place.
  virtual void on_frame(Connection* c, const FrameHeader& h, void* payload) = 0;
  // The connection is gone. clean is true after the peer said kFrameBye.
  virtual void on_close(Connection* c, bool clean, const std::string& reason) = 0;
};

class Connection {
 public:
  virtual ~Connection() = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Queues header + payload; the payload memory must stay valid until on_sent
  // runs (or the connection dies, in which case on_sent is dropped unrun).
  // Returns false if the connection is already closed.
  virtual bool send(const FrameHeader& h, const void* payload, size_t len,
                    std::function<void()> on_sent = nullptr) = 0;
  // Queues a frame with no payload ahead of every queued frame not yet started (a
  // control message that must not wait behind megabytes of answers).
  virtual bool send_first(const FrameHeader& h) = 0;
  virtual bool closed() const = 0;
  // True when nothing is waiting to be written.
  virtual bool idle() = 0;
  // Ends this side's sending (the peer reads to the end of what was sent, then sees the
  // close); frames still arrive until the peer closes its side.
  virtual void shutdown_send() = 0;
  // Ends the connection from any thread; the handler's on_close follows on the loop thread.
  virtual void shutdown_both() = 0;
  // Caps the rate this end sends at, bytes/s (<= 0: no cap), where the transport can.
  virtual void set_pacing(double bytes_per_s) = 0;
  // Adds every byte written / read to these counters (either may be null). Set before
  // the connection starts carrying frames.
  virtual void count_bytes(std::atomic<uint64_t>* sent, std::atomic<uint64_t>* received) = 0;
  // Adds the bytes of every frame queued from now on to *unsent and takes them off as they
  // are written, or dropped when the connection closes: a sender's backlog over several
  // connections (the server's pacing burst rule). Set before the connection carries frames.
  virtual void count_unsent(std::atomic<int64_t>* unsent) = 0;

  const Peer& peer() const { return peer_; }
  const std::string& desc() const { return desc_; }
  // The handler's slot for the object a frame is being received into (on_header sets
  // it, on_frame takes it).
  std::shared_ptr<void> rx_hold;

 protected:
  Connection(Peer peer, std::string desc) : peer_(peer), desc_(std::move(desc)) {}

 private:
  Peer peer_;
  std::string desc_;
};

}  // namespace fastps
