// The frame format on every connection: a fixed 64-byte header followed by
// `len` payload bytes, or by none when the payload is a shared-memory slot
// reference (kFlagShm). Little-endian hosts only. What the frame types and
// the tensor fields mean is the application's: protocol/messages.h.
#pragma once
#include <cstddef>
#include <cstdint>

namespace fastps {

constexpr uint32_t kFrameMagic = 0x4D535046;      // "FPSM"
constexpr uint32_t kHelloMagic = 0x48535046;      // "FPSH"
constexpr uint32_t kChallengeMagic = 0x43535046;  // "FPSC"
constexpr uint32_t kBusyMagic = 0x42535046;  // "FPSB": sent instead of a challenge, retry later
constexpr size_t kNonceBytes = 32;
// Upper bound on one part (FASTPS_PARTITION_BYTES may not exceed it); a header
// claiming more is rejected before anything is allocated for it.
constexpr uint64_t kMaxPartBytes = 256ull << 20;
// Upper bound on the text of an error frame.
constexpr uint64_t kMaxTextBytes = 64ull << 10;

// The one frame type the transport itself understands: the sender closes the
// connection cleanly after it. Every other type belongs to the application
// (protocol/messages.h); the transport only carries it.
constexpr uint8_t kFrameBye = 5;

// FrameHeader.flags bits.
constexpr uint16_t kFlagShm = 1;  // the part lies in shared memory; no payload follows
// Routed parts (protocol/messages.h): a push may carry no data, only ask for the result
// (kFlagNoData: len is the size of the part wanted, no payload follows), or carry data
// and want no result back (kFlagNoReply: answered by a header with len 0).
constexpr uint16_t kFlagNoData = 2;
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
// copy to the owner; the shm fields carry the route instead of a slot (never both): the
// owner's server id in shm_segment, the pushes the owner waits for in shm_offset.
constexpr uint16_t kFlagRelay = 128;
constexpr uint16_t kKnownFlags = kFlagShm | kFlagNoData | kFlagNoReply | kFlagQuorum | kFlagAsync |
                                 kFlagAsyncInit | kFlagCompressed | kFlagRelay;

// Naturally aligned (every field at a multiple of its size), so no packing is needed and
// the header can live inside other structs without misaligned loads.
struct FrameHeader {
  uint32_t magic;
  uint8_t type;
  uint8_t dtype;
  uint16_t flags;
  uint32_t sender;        // worker rank (pushes) or server id (replies)
  uint32_t part;          // part index within its tensor
  uint64_t tensor;        // tensor id, the same on every worker
  uint64_t len;           // payload bytes (following the header unless kFlagShm)
  uint64_t tensor_bytes;  // whole tensor's bytes, to catch mismatched workers
  uint64_t round;         // how many times this part was pushed before
  uint64_t shm_offset;    // kFlagShm: byte offset of the part in the segment
  uint32_t shm_segment;   // kFlagShm: rank of the worker whose segment holds it
  uint32_t pushers;       // kPush: pushes per part the server waits for (0: every worker),
                          // want-only pushes (kFlagNoData) included
};

#pragma pack(push, 1)
struct Challenge {
  uint32_t magic;
  uint8_t nonce[kNonceBytes];
};

// mac = HMAC-SHA256(token, nonce || job_id || rank as 4 little-endian bytes)
struct Hello {
  uint32_t magic;
  uint32_t rank;
  uint32_t conn_index;
  uint8_t mac[32];
};
#pragma pack(pop)

static_assert(sizeof(FrameHeader) == 64, "wire header layout");
static_assert(offsetof(FrameHeader, tensor) == 16 && offsetof(FrameHeader, shm_offset) == 48 &&
                  offsetof(FrameHeader, pushers) == 60,
              "wire header layout");

// Bytes that follow a header on the socket: none for parts that lie in shared memory.
inline uint64_t payload_bytes(const FrameHeader& h) {
  return (h.flags & (kFlagShm | kFlagNoData)) ? 0 : h.len;
}

}  // namespace fastps
