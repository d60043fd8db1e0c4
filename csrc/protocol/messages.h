// The application's messages between workers, local peers and summation
// servers, carried in transport frames (transport/wire.h) with the protocol's
// flags (protocol/flags.h), and the key every end indexes a part's state by.
#pragma once
#include <cstdint>

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
  kNudge = 11,       // server -> worker: every other copy of this part is in; push it next
                     // (len 0; round: the round the server is waiting to close)
};

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
