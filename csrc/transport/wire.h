// The frame format on every connection: a fixed 64-byte header followed by
// `len` payload bytes, or by none when the payload is a shared-memory slot
// reference (kFlagShm) or the frame is header-only (kFlagNoPayload). Little-endian
// hosts only. What the frame types, the other flags and the tensor fields mean is
// the application's: protocol/messages.h, protocol/flags.h.
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

// FrameHeader.flags bits the transport reads: how the payload travels. Every other bit
// belongs to the application (protocol/flags.h); the transport carries them as they are.
// kFlagShm: the payload lies in a shared-memory slot (shm_segment, shm_offset), no bytes
// follow; only Link::send sets it. kFlagNoPayload: no bytes follow, and len is the
// application's to interpret (a want-only push: the size of the part it asks for).
constexpr uint16_t kFlagShm = 1;
constexpr uint16_t kFlagNoPayload = 2;

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
  uint64_t len;           // payload bytes (following the header unless kFlagShm/NoPayload)
  uint64_t tensor_bytes;  // whole tensor's bytes, to catch mismatched workers
  uint64_t round;         // how many times this part was pushed before
  // With kFlagShm, the slot the payload lies in (Link::send sets both): the byte offset
  // in the segment, and the rank of the worker whose segment holds it. Without it the
  // transport neither reads nor writes them; the application may give them a meaning
  // of its own (protocol/flags.h, protocol/messages.h).
  uint64_t shm_offset;
  uint32_t shm_segment;
  uint32_t pushers;  // kPush: pushes per part the server waits for (0: every worker),
                     // want-only pushes included
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

// Bytes that follow a header on the socket: none for a slot reference or a header-only frame.
inline uint64_t payload_bytes(const FrameHeader& h) {
  return (h.flags & (kFlagShm | kFlagNoPayload)) ? 0 : h.len;
}

}  // namespace fastps
