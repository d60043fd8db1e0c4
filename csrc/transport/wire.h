// Frames exchanged between workers and summation servers. Every data frame is
// a fixed header followed by `len` payload bytes. Little-endian hosts only.
#pragma once
#include <cstddef>
#include <cstdint>

namespace fastps {

constexpr uint32_t kFrameMagic = 0x4D535046;  // "FPSM"
constexpr uint32_t kHelloMagic = 0x48535046;  // "FPSH"
constexpr uint32_t kChallengeMagic = 0x43535046;  // "FPSC"
constexpr size_t kNonceBytes = 32;
// Upper bound on one part; larger frames are treated as garbage.
constexpr uint64_t kMaxPartBytes = 1ull << 31;

enum class MsgType : uint8_t {
  kPush = 1,    // worker -> server: a part to add to this round's sum
  kResult = 2,  // server -> worker: the complete sum of a part (answers a push)
  kError = 3,   // server -> worker: this part cannot be summed (payload: text)
  kFatal = 4,   // server -> worker: the job cannot go on (payload: text)
  kBye = 5,     // either side: clean close follows
  kShmAttach = 6,    // worker -> colocated server: map my segment (shm_segment = my rank)
  kShmAttached = 7,  // server -> worker: mapped (len 0) or not (payload: why)
  kLocalPush = 8,    // worker -> local owner of a part: my contribution to it
  kLocalResult = 9,  // local owner -> worker: the part's global sum
  kLocalError = 10,  // local owner -> worker: this tensor failed (payload: text)
};

// FrameHeader.flags bits.
constexpr uint16_t kFlagShm = 1;  // the part lies in shared memory; no payload follows

// Naturally aligned (every field at a multiple of its size), so no packing is needed and
// the header can live inside other structs without misaligned loads.
struct FrameHeader {
  uint32_t magic;
  uint8_t type;
  uint8_t dtype;
  uint16_t flags;
  uint32_t sender;         // worker rank (pushes) or server id (replies)
  uint32_t part;           // part index within its tensor
  uint64_t tensor;         // tensor id, the same on every worker
  uint64_t len;            // payload bytes following the header
  uint64_t tensor_bytes;   // whole tensor's bytes, to catch mismatched workers
  uint64_t round;          // how many times this part was pushed before
  uint64_t shm_offset;     // kFlagShm: byte offset of the part in the segment
  uint32_t shm_segment;    // kFlagShm: rank of the worker whose segment holds it
  uint32_t pushers;        // kPush: pushes per part the server waits for (0: every worker)
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

// The key of a part on both ends of the wire: tensor id mixed with the part index. Workers
// and servers index their per-part state by it, so it must be the same everywhere.
inline uint64_t part_key(uint64_t tensor, uint32_t part) {
  return tensor ^ (static_cast<uint64_t>(part) * 0x9E3779B97F4A7C15ull);
}

// Bytes that follow a header on the socket: none for parts that lie in shared memory.
inline uint64_t payload_bytes(const FrameHeader& h) { return (h.flags & kFlagShm) ? 0 : h.len; }

}  // namespace fastps
