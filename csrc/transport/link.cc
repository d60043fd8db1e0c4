#include "transport/link.h"

namespace fastps {

bool Link::send(FrameHeader h, const Payload& p, std::function<void()> on_sent) const {
  // Whether a payload travels as a slot reference is this link's decision: a reference
  // copied from another frame's header does not survive. Without kFlagShm the slot fields
  // are the application's (wire.h) and go out as they are.
  if (h.flags & kFlagShm) {
    h.flags &= static_cast<uint16_t>(~kFlagShm);
    h.shm_segment = 0;
    h.shm_offset = 0;
  }
  // A header-only frame: len is the application's (a want-only push names the part's size).
  if (h.flags & kFlagNoPayload) return conn_->send(h, nullptr, 0, std::move(on_sent));
  h.len = p.len;
  if (by_slot(p)) {
    h.flags |= kFlagShm;
    h.shm_segment = p.segment;
    h.shm_offset = p.offset;
    // The slot's reference counts, not this frame, keep its bytes alive.
    return conn_->send(h, nullptr, 0, std::move(on_sent));
  }
  if (!p.keep && !p.mapping) return conn_->send(h, p.data, p.len, std::move(on_sent));
  return conn_->send(h, p.data, p.len,
                     [keep = p.keep, mapping = p.mapping, cb = std::move(on_sent)] {
                       if (cb) cb();
                     });
}

Payload received_payload(const FrameHeader& h, void* bytes, std::shared_ptr<void> hold,
                         const SlotSpace* slots) {
  if (h.flags & kFlagNoPayload) return Payload{};  // a header-only frame carries nothing
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
