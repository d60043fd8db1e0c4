// The application's messages between workers, local peers and summation
// servers, carried in transport frames (transport/wire.h) with the protocol's
// flags (protocol/flags.h), and the key every end indexes a part's state by.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "protocol/flags.h"
#include "transport/wire.h"

namespace fastps {

enum class MsgType : uint8_t {
  kPush = 1,         // worker -> server: a part to add to this round's sum
  kResult = 2,       // server -> worker: the complete sum of a part (answers a push)
  kError = 3,        // server -> worker: this part cannot be summed (payload: text)
  kFatal = 4,        // server -> worker: the job cannot go on (payload: text)
  kBye = kFrameBye,  // either side: clean close follows (handled by the transport)
  kShmAttach = 6,    // worker -> colocated server: map my segment (shm_segment = my rank,
                     // shm_offset = its nonce; a frame without payload, so the transport
                     // leaves both alone)
  kShmAttached = 7,  // server -> worker: mapped (len 0) or not (payload: why)
  kLocalPush = 8,    // worker -> local owner of a part: my contribution to it
  kLocalResult = 9,  // local owner -> worker: the part's global sum
  kLocalError = 10,  // local owner -> worker: this tensor failed (payload: text)
  kNudge = 11,       // server -> worker: push this part next, the others' copies wait for yours
                     // (len 0; round: the round the server is waiting to close)
};

// Local SGD / DiLoCo (docs/guide/local-sgd.md, server/outer_optimizer.h): the async pushes of
// a part whose outer step runs on its server carry this header in front of the part's
// elements, in both directions (the worker core does not know the mode, so it travels
// in-band). Rank 0's init (kFlagAsyncInit, kind kOuterInit) names the outer optimizer; each
// update (kFlagAsync, kind kOuterDelta) is one worker's delta of outer round `round`; every
// answer (kind kOuterParams) holds the parameters after `round` outer steps. `check` mixes the
// other fields, so an ordinary async parameter whose bytes begin with the magic is not taken
// for an outer one. A compressed delta (flags kOuterCompressed) is followed by one compressed
// part (compression/part_codec.h: CompressedHeader and body) instead of the elements, and
// `wire_len` says how many bytes of the part's span travel (header included, padded to the
// element size): the worker core sends only those (outer_wire_len), the server decodes them.
constexpr uint64_t kOuterMagic = 0x31525455'4F535046ull;  // "FPSOUTR1"
constexpr uint32_t kOuterInit = 1;
constexpr uint32_t kOuterDelta = 2;
constexpr uint32_t kOuterParams = 3;
constexpr uint32_t kOuterNesterov = 1;    // OuterHeader.flags
constexpr uint32_t kOuterCompressed = 2;  // OuterHeader.flags: a compressed delta
struct OuterHeader {
  uint64_t magic;
  uint32_t kind;
  uint32_t flags;
  uint64_t round;
  double lr;
  double momentum;
  uint64_t tensor;  // the part it travels in: a header copied to another part is refused
  uint32_t part;
  uint32_t wire_len;  // a compressed delta's bytes on the wire, this header included; else 0
  uint64_t check;
};
static_assert(sizeof(OuterHeader) == 64, "outer header layout");
// Fills in or verifies OuterHeader.check: a 64-bit mix of every other field.
inline uint64_t outer_check(const OuterHeader& h) {
  uint64_t w[8];
  std::memcpy(w, &h, sizeof w);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < 7; ++i) {  // every word but the check itself
    x ^= w[i] + 0x9E3779B97F4A7C15ull + (x << 6) + (x >> 2);
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 31;
  }
  return x;
}

// How many of the `len` bytes of an async update's part at `part` go on the wire: the
// `wire_len` of a compressed outer delta's valid header (at least the header, at most len),
// else all of them. The worker core's only knowledge of outer frames.
inline size_t outer_wire_len(const void* part, size_t len) {
  if (len < sizeof(OuterHeader)) return len;
  OuterHeader h;
  std::memcpy(&h, part, sizeof h);
  if (h.magic != kOuterMagic || h.kind != kOuterDelta || !(h.flags & kOuterCompressed) ||
      h.wire_len < sizeof(OuterHeader) || h.wire_len > len || h.check != outer_check(h))
    return len;
  return h.wire_len;
}

// The header of an answer (a result, an error) to the push `push`: the push's part fields,
// sent by `sender`; no flags, and no slot reference or relay route (Link::send adds a slot
// reference where the answer is one). pushers is left as the push had it.
inline FrameHeader answer_header(const FrameHeader& push, MsgType type, uint32_t sender) {
  FrameHeader a = push;
  a.type = static_cast<uint8_t>(type);
  a.sender = sender;
  a.flags = 0;
  a.shm_offset = 0;
  a.shm_segment = 0;
  return a;
}

// The key of a part on both ends of the wire: tensor id mixed with the part
// index. Workers and servers index their per-part state by it, so it must be
// the same everywhere.
inline uint64_t part_key(uint64_t tensor, uint32_t part) {
  return tensor ^ (static_cast<uint64_t>(part) * 0x9E3779B97F4A7C15ull);
}

}  // namespace fastps
