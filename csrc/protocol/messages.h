// The application's messages between workers, local peers and summation
// servers, carried in transport frames (transport/wire.h), and the key every
// end indexes a part's state by.
#pragma once
#include <cstdint>

#include "transport/wire.h"

namespace fastps {

enum class MsgType : uint8_t {
  kPush = 1,         // worker -> server: a part to add to this round's sum
  kResult = 2,       // server -> worker: the complete sum of a part (answers a push)
  kError = 3,        // server -> worker: this part cannot be summed (payload: text)
  kFatal = 4,        // server -> worker: the job cannot go on (payload: text)
  kBye = kFrameBye,  // either side: clean close follows (handled by the transport)
  kShmAttach = 6,    // worker -> colocated server: map my segment (shm_segment = my rank)
  kShmAttached = 7,  // server -> worker: mapped (len 0) or not (payload: why)
  kLocalPush = 8,    // worker -> local owner of a part: my contribution to it
  kLocalResult = 9,  // local owner -> worker: the part's global sum
  kLocalError = 10,  // local owner -> worker: this tensor failed (payload: text)
  kNudge = 11,       // server -> worker: every other copy of this part is in; push it next
                     // (len 0; round: the round the server is waiting to close)
};

// The key of a part on both ends of the wire: tensor id mixed with the part
// index. Workers and servers index their per-part state by it, so it must be
// the same everywhere.
inline uint64_t part_key(uint64_t tensor, uint32_t part) {
  return tensor ^ (static_cast<uint64_t>(part) * 0x9E3779B97F4A7C15ull);
}

}  // namespace fastps
