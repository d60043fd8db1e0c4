// A link: one connection to a peer, plus whether that peer mapped this
// process's shared-memory segments. The one place that decides how a payload
// travels: as a slot reference (header only, kFlagShm) when it lies in a slot
// the peer can read, else as bytes on the socket after the header.
#pragma once
#include <functional>
#include <memory>

#include "transport/connection.h"
#include "transport/payload.h"

namespace fastps {

class Link {
 public:
  Link() = default;
  Link(std::shared_ptr<Connection> conn, bool peer_maps_slots)
      : conn_(std::move(conn)), peer_maps_slots_(peer_maps_slots) {}

  // Whether p would travel as a slot reference on this link.
  bool by_slot(const Payload& p) const { return peer_maps_slots_ && p.in_slot() && p.len > 0; }
  // Sends h with payload p (h.len, kFlagShm and the slot fields are filled in here, unless
  // h is header-only: kFlagNoPayload); the payload's bytes stay alive until written. False
  // if the connection is closed.
  bool send(FrameHeader h, const Payload& p, std::function<void()> on_sent = nullptr) const;
  // A frame with no payload.
  bool send(FrameHeader h) const { return send(h, Payload{}); }

  bool peer_maps_slots() const { return peer_maps_slots_; }
  void set_peer_maps_slots(bool on) { peer_maps_slots_ = on; }
  Connection* connection() const { return conn_.get(); }
  const std::shared_ptr<Connection>& shared() const { return conn_; }
  const std::string& desc() const { return conn_->desc(); }

 private:
  std::shared_ptr<Connection> conn_;
  bool peer_maps_slots_ = false;
};

// Whether a frame's payload is a slot reference, and whether it names slot p.
inline bool refers_to_slot(const FrameHeader& h) { return (h.flags & kFlagShm) != 0; }
inline bool refers_to(const FrameHeader& h, const Payload& p) {
  return refers_to_slot(h) && p.in_slot() && h.shm_segment == p.segment && h.shm_offset == p.offset;
}

// The payload of a frame that arrived: the bytes received after its header
// (held alive by hold), or the slot it references, resolved in slots (null:
// this end maps no segments). An empty payload with len > 0 means the
// reference points outside every mapped segment: the caller refuses the frame.
Payload received_payload(const FrameHeader& h, void* bytes, std::shared_ptr<void> hold,
                         const SlotSpace* slots);

}  // namespace fastps
