// A rack server's uplink (PHub §3.4, hierarchical reduction): the part sums of this rack
// that other racks' servers own go out once per rack over an authenticated connection to
// each owner, and the owners' answers come back here to be fanned out to the rack's
// workers (by the engine that holds the part, server/engine.h).
//
// The relay presents itself to an owner as the lowest worker rank of its rack, so the
// owner waits for it like for any pusher; its connections carry kRelayConnBit in their
// connection index so the owner names it "rack server N" in its reports.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/buffer_pool.h"
#include "transport/payload.h"
#include "transport/tcp.h"

namespace fastps {

// Set in a relay connection's handshake conn_index (the low bits: the relaying server's id).
constexpr uint32_t kRelayConnBit = 0x80000000u;

struct RackRoute {
  std::vector<std::string> owners;  // "host:port" of every server, by position
  std::vector<uint32_t> owner_ids;  // their server ids, same order
  uint32_t rank = 0;                // the worker rank this rack's relays push as
  std::string rack;                 // this rack's name, for messages
};

class RackRelay : public FrameHandler {
 public:
  // An owner's answer (kResult with the sum, or kError with text) for the engines.
  using Deliver = std::function<void(const FrameHeader&, Payload)>;
  // The job cannot go on (an owner vanished or said kFatal).
  using Fail = std::function<void(const std::string&)>;
  RackRelay(uint32_t server_id, std::string job_id, std::string token, double timeout_s,
            Deliver deliver, Fail fail);
  ~RackRelay() override;
  void configure(RackRoute route);
  bool configured() const;
  // Caps the rate of the rack sums to each owner (bytes/s by owner position, 0: unpaced),
  // on open links and on those made later.
  void set_pacing(std::vector<double> per_owner);
  // Rack sums held back now because the route has not arrived yet (see link_to).
  uint64_t awaiting_route() const {
    std::lock_guard<std::mutex> lock(mu_);
    return awaiting_route_;
  }
  // Sends a rack's sum to its owner (connecting on first use). h is the push as the
  // owner must see it, but for its sender: the route's relay rank, stamped here once the
  // route is known (a sum may come before it). False with *why when the owner cannot be
  // reached. stop() says bye to the owners, so they do not take this server's exit for a crash.
  bool forward(uint32_t owner_id, FrameHeader h, const Payload& sum, std::string* why);
  void stop();

  void* on_header(Connection* c, const FrameHeader& h, std::string* why) override;
  void on_frame(Connection* c, const FrameHeader& h, void* payload) override;
  void on_close(Connection* c, bool clean, const std::string& reason) override;

 private:
  std::shared_ptr<Connection> link_to(uint32_t owner_id, std::string* why, size_t* pos);
  size_t position(Connection* c) const;  // caller holds mu_

  uint32_t server_id_;
  std::string job_id_;
  std::string token_;
  double timeout_s_;
  Deliver deliver_;
  Fail fail_;
  std::shared_ptr<BufferPool> pool_ = std::make_shared<BufferPool>();
  mutable std::mutex mu_;
  std::condition_variable configured_cv_;  // the route arrived, or the relay stops
  RackRoute route_;
  std::vector<std::shared_ptr<Connection>> conns_;  // by owner position; null: not yet
  // Sums sent to each owner and not answered yet: an uplink that closes with none
  // outstanding (the owner shut down first) is no failure until something needs it.
  std::vector<uint64_t> outstanding_;
  std::vector<double> pacing_;  // bytes/s by owner position
  std::unique_ptr<EventLoop> loop_;
  bool stopping_ = false;
  uint64_t awaiting_route_ = 0;  // callers of link_to waiting for the route
};

}  // namespace fastps
