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
};

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

static_assert(sizeof(FrameHeader) == 48, "wire header layout");
static_assert(offsetof(FrameHeader, tensor) == 16 && offsetof(FrameHeader, round) == 40,
              "wire header layout");

}  // namespace fastps
