// The FrameHeader.flags bits that mean something to the protocol, and the header
// fields some of them give a meaning to. The transport (transport/wire.h) reads only
// kFlagShm and kFlagNoPayload; it carries every bit here as it is. Which combinations
// are valid, per message type, is protocol/frame_check's.
#pragma once
#include <cstdint>

#include "transport/wire.h"

namespace fastps {

// Routed parts (protocol/messages.h): a push may carry no data, only ask for the result
// (kFlagNoData: len is the size of the part wanted; the transport sends the header only),
// or carry data and want no result back (kFlagNoReply: answered by a header with len 0).
constexpr uint16_t kFlagNoData = kFlagNoPayload;
constexpr uint16_t kFlagNoReply = 4;
// Beyond lock-step (docs/guide/async.md): a plain sum push whose round the server may close
// once FASTPS_ROUND_QUORUM pushes are in (kFlagQuorum); an update to a parameter part the
// server keeps (kFlagAsync: payload is a delta, answered with the current parameters;
// with kFlagNoData a read of them); the part's initial value from rank 0 (kFlagAsyncInit;
// with kFlagNoData: wait for that value and receive it).
constexpr uint16_t kFlagQuorum = 8;
constexpr uint16_t kFlagAsync = 16;
constexpr uint16_t kFlagAsyncInit = 32;
// The payload is a compressed part (compression/part_codec.h): len counts the compressed
// bytes; dtype and tensor_bytes still describe the tensor itself.
constexpr uint16_t kFlagCompressed = 64;
// Rack-level hierarchy (PHub §3.4, server/rack_relay.h): a push to this rack's server for a
// part another rack's server owns. The rack server sums its rack's pushes and forwards one
// copy to the owner. Its route travels in the header (RelayRoute, below).
constexpr uint16_t kFlagRelay = 128;
constexpr uint16_t kKnownFlags = kFlagShm | kFlagNoData | kFlagNoReply | kFlagQuorum | kFlagAsync |
                                 kFlagAsyncInit | kFlagCompressed | kFlagRelay;

// Where a relayed push's rack sum goes: the owner's server id, and how many pushes the
// owner waits for per part. A relayed push is a plain sum in bytes, never a slot reference
// and never header-only (frame_check), so the transport leaves the header's slot fields
// alone and the route is encoded in them: the owner in shm_segment, its pushers in
// shm_offset. Nothing else reads those fields of a relayed push.
struct RelayRoute {
  uint32_t owner = 0;
  uint64_t owner_pushers = 0;
};

// Marks h as a relayed push along route r.
inline void set_relay_route(FrameHeader* h, const RelayRoute& r) {
  h->flags |= kFlagRelay;
  h->shm_segment = r.owner;
  h->shm_offset = r.owner_pushers;
}
// Makes a relayed push h a push to the owner itself: no kFlagRelay, no route.
inline void clear_relay_route(FrameHeader* h) {
  h->flags &= static_cast<uint16_t>(~kFlagRelay);
  h->shm_segment = 0;
  h->shm_offset = 0;
}
// The route of a relayed push (h.flags has kFlagRelay).
inline RelayRoute relay_route(const FrameHeader& h) {
  RelayRoute r;
  r.owner = h.shm_segment;
  r.owner_pushers = h.shm_offset;
  return r;
}

}  // namespace fastps
