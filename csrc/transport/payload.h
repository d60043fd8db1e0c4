// A frame's payload, wherever its bytes are: in this process's memory, or in
// a slot of a shared-memory segment that both ends of a link have mapped. The
// core hands the transport payloads and gets payloads back; which way the
// bytes travel follows from the payload and the link (transport/link.h), not
// from branches at every call site. An RDMA transport would add a third kind
// (a registered memory region) here and nowhere else in the core.
#pragma once
#include <cstdint>
#include <memory>

#include "transport/shm.h"

namespace fastps {

constexpr uint32_t kNoSegment = 0xFFFFFFFFu;

struct Payload {
  char* data = nullptr;  // the bytes, as this process sees them
  uint64_t len = 0;
  // In a slot: rank of the worker whose segment holds it, and where.
  uint32_t segment = kNoSegment;
  uint64_t offset = 0;
  // Keeps the bytes alive: the buffer they are in, or the segment's mapping.
  std::shared_ptr<void> keep;
  std::shared_ptr<ShmSegment> mapping;  // set for slots

  // Bytes in process memory; const data is only ever read (sent) through it.
  static Payload memory(const void* data, uint64_t len, std::shared_ptr<void> keep = nullptr) {
    Payload p;
    p.data = static_cast<char*>(const_cast<void*>(data));
    p.len = len;
    p.keep = std::move(keep);
    return p;
  }
  static Payload slot(std::shared_ptr<ShmSegment> seg, uint32_t segment, uint64_t offset,
                      uint64_t len) {
    Payload p;
    p.data = seg->at(offset);
    p.len = len;
    p.segment = segment;
    p.offset = offset;
    p.mapping = std::move(seg);
    return p;
  }
  bool empty() const { return data == nullptr; }
  bool in_slot() const { return segment != kNoSegment; }
  bool same_slot(const Payload& o) const { return segment == o.segment && offset == o.offset; }
  // Slot reference counts (ShmSegment::ref): no-ops for payloads in memory.
  void ref(uint32_t n) const {
    if (mapping && n) mapping->ref(offset, n);
  }
  void unref() const {
    if (mapping) mapping->unref(offset);
  }
};

// The shared-memory segments one process has mapped, by the rank that owns
// each: what turns a slot reference arriving in a frame into bytes.
class SlotSpace {
 public:
  virtual ~SlotSpace() = default;
  // The slot [offset, offset + len) of segment's mapping; an empty payload if
  // that range is not inside a segment this process mapped.
  virtual Payload resolve(uint32_t segment, uint64_t offset, uint64_t len) const = 0;
};

}  // namespace fastps
