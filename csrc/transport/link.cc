#include "transport/link.h"

namespace fastps {

bool Link::send(FrameHeader h, const Payload& p, std::function<void()> on_sent) const {
  if (h.flags & kFlagNoData) {
    // A want-only push: the header names the part (its len included), no bytes follow.
    h.flags &= static_cast<uint16_t>(~kFlagShm);
    h.shm_segment = 0;
    h.shm_offset = 0;
    return conn_->send(h, nullptr, 0, std::move(on_sent));
  }
  h.len = p.len;
  if (by_slot(p)) {
    h.flags |= kFlagShm;
    h.shm_segment = p.segment;
    h.shm_offset = p.offset;
    // The slot's reference counts, not this frame, keep its bytes alive.
    return conn_->send(h, nullptr, 0, std::move(on_sent));
  }
  h.flags &= static_cast<uint16_t>(~kFlagShm);
  if (!(h.flags & kFlagRelay)) {  // a relayed push's shm fields carry its route (wire.h)
    h.shm_segment = 0;
    h.shm_offset = 0;
  }
  if (!p.keep && !p.mapping) return conn_->send(h, p.data, p.len, std::move(on_sent));
  return conn_->send(h, p.data, p.len,
                     [keep = p.keep, mapping = p.mapping, cb = std::move(on_sent)] {
                       if (cb) cb();
                     });
}

Payload received_payload(const FrameHeader& h, void* bytes, std::shared_ptr<void> hold,
                         const SlotSpace* slots) {
  if (h.flags & kFlagNoData) return Payload{};  // a want-only push carries nothing
  if (!(h.flags & kFlagShm)) return Payload::memory(bytes, h.len, std::move(hold));
  if (!slots) {
    Payload bad;
    bad.len = h.len;
    return bad;
  }
  Payload p = slots->resolve(h.shm_segment, h.shm_offset, h.len);
  p.len = h.len;
  return p;
}

}  // namespace fastps
