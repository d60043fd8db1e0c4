#include "protocol/frame_check.h"

#include <sstream>

#include "common/dtype.h"
#include "compression/part_codec.h"
#include "protocol/flags.h"

namespace fastps {
namespace {

bool is_text(MsgType t) {
  return t == MsgType::kError || t == MsgType::kFatal || t == MsgType::kShmAttached ||
         t == MsgType::kLocalError;
}

bool is_data(MsgType t) {
  return t == MsgType::kPush || t == MsgType::kResult || t == MsgType::kLocalPush ||
         t == MsgType::kLocalResult;
}

template <typename T>
bool bad(std::string* why, const char* field, T value, const std::string& rule) {
  std::ostringstream os;
  os << "frame header field " << field << " = " << value << " " << rule;
  *why = os.str();
  return false;
}

}  // namespace

bool check_frame_header(const FrameHeader& h, std::string* why) {
  if (h.magic != kFrameMagic) return bad(why, "magic", h.magic, "is not the frame magic");
  if (h.type < static_cast<uint8_t>(MsgType::kPush) ||
      h.type > static_cast<uint8_t>(MsgType::kNudge))
    return bad(why, "type", static_cast<unsigned>(h.type), "is not a known message type");
  if (h.flags & ~kKnownFlags) return bad(why, "flags", h.flags, "has unknown bits");
  auto type = static_cast<MsgType>(h.type);
  if (type == MsgType::kNudge && h.len != 0) return bad(why, "len", h.len, "must be 0 in a nudge");
  if (is_text(type) && h.len > kMaxTextBytes)
    return bad(why, "len", h.len,
               "exceeds the " + std::to_string(kMaxTextBytes) + "-byte limit of a text frame");
  if (h.len > kMaxPartBytes)
    return bad(why, "len", h.len,
               "exceeds the " + std::to_string(kMaxPartBytes) + "-byte part limit");
  if ((h.flags & kFlagShm) && !is_data(type))
    return bad(why, "flags", h.flags, "marks a non-data frame as shared memory");
  if ((h.flags & (kFlagNoData | kFlagNoReply)) && type != MsgType::kPush)
    return bad(why, "flags", h.flags, "marks a frame other than a push as routed");
  if ((h.flags & (kFlagNoData | kFlagNoReply)) == (kFlagNoData | kFlagNoReply))
    return bad(why, "flags", h.flags, "asks for no result and carries no data");
  if ((h.flags & kFlagShm) && (h.flags & (kFlagNoData | kFlagNoReply)))
    return bad(why, "flags", h.flags, "marks a routed push as shared memory");
  if ((h.flags & (kFlagQuorum | kFlagAsync | kFlagAsyncInit)) && type != MsgType::kPush)
    return bad(why, "flags", h.flags, "marks a frame other than a push as quorum or async");
  if ((h.flags & kFlagAsync) && (h.flags & kFlagAsyncInit))
    return bad(why, "flags", h.flags, "marks a push as both an async update and an init");
  // A quorum push may be want-only (kFlagNoData): a catch-up fetch of a closed round.
  if ((h.flags & kFlagQuorum) && (h.flags & (kFlagAsync | kFlagAsyncInit | kFlagNoReply)))
    return bad(why, "flags", h.flags,
               "marks a push without reply or an async push as a quorum round");
  if ((h.flags & (kFlagAsync | kFlagAsyncInit)) && (h.flags & (kFlagShm | kFlagNoReply)))
    return bad(why, "flags", h.flags, "marks an async push as shared memory or without reply");
  if ((h.flags & kFlagCompressed) && type != MsgType::kPush && type != MsgType::kResult)
    return bad(why, "flags", h.flags, "marks a frame other than a push or result as compressed");
  if ((h.flags & kFlagCompressed) && (h.flags & (kFlagShm | kFlagNoData | kFlagNoReply |
                                                 kFlagQuorum | kFlagAsync | kFlagAsyncInit)))
    return bad(why, "flags", h.flags,
               "marks a shared-memory, routed, quorum or async part as compressed");
  if ((h.flags & kFlagRelay) && type != MsgType::kPush)
    return bad(why, "flags", h.flags, "marks a frame other than a push as relayed");
  if ((h.flags & kFlagRelay) && (h.flags & ~kFlagRelay))
    return bad(why, "flags", h.flags,
               "marks a shared-memory, routed, quorum, async or "
               "compressed push as relayed (a relayed push is a plain sum in bytes)");
  if (!is_data(type)) return true;
  if (h.dtype >= static_cast<uint8_t>(DType::kCount))
    return bad(why, "dtype", static_cast<unsigned>(h.dtype), "is not a known dtype code");
  size_t elem = dtype_size(static_cast<DType>(h.dtype));
  if (h.flags & kFlagCompressed) {
    // A compressed part: its header (checked when decoded) and a body no larger than
    // the largest codec writes for the tensor's element count.
    if (!compressible(static_cast<DType>(h.dtype)))
      return bad(why, "dtype", dtype_name(static_cast<DType>(h.dtype)),
                 "cannot be compressed (float types only)");
    if (h.len < sizeof(CompressedHeader))
      return bad(why, "len", h.len, "is shorter than a compressed part's header");
    if (h.len > max_compressed_bytes(h.tensor_bytes / elem))
      return bad(why, "len", h.len,
                 "exceeds the largest compressed form of a " + std::to_string(h.tensor_bytes) +
                     "-byte tensor");
    return true;
  }
  if (h.len % elem != 0)
    return bad(why, "len", h.len,
               std::string("is not a multiple of the ") + dtype_name(static_cast<DType>(h.dtype)) +
                   " element size");
  if (h.len > h.tensor_bytes)
    return bad(why, "tensor_bytes", h.tensor_bytes,
               "is smaller than the part's len " + std::to_string(h.len));
  return true;
}

bool check_server_frame(const FrameHeader& h, uint32_t peer_rank, uint32_t num_workers,
                        std::string* why) {
  if (!check_frame_header(h, why)) return false;
  auto type = static_cast<MsgType>(h.type);
  if (type != MsgType::kPush && type != MsgType::kShmAttach)
    return bad(why, "type", static_cast<unsigned>(h.type), "is not a worker-to-server message");
  if (h.sender != peer_rank)
    return bad(why, "sender", h.sender,
               "is not the authenticated rank " + std::to_string(peer_rank));
  if (type == MsgType::kShmAttach) {
    if (h.len != 0) return bad(why, "len", h.len, "is not 0 in a shared-memory attach");
    return true;
  }
  if (h.pushers > num_workers)
    return bad(why, "pushers", h.pushers,
               "exceeds the job's " + std::to_string(num_workers) + " workers");
  if (h.flags & kFlagRelay) {
    // The route rides in the slot fields (protocol/flags.h); the owner's id is not a rank.
    uint64_t owner_pushers = relay_route(h).owner_pushers;
    if (owner_pushers == 0 || owner_pushers > num_workers)
      return bad(why, "shm_offset", owner_pushers,
                 "(pushes the owner of a relayed part waits for) is not in 1.." +
                     std::to_string(num_workers));
  }
  if ((h.flags & kFlagShm) && h.shm_segment >= num_workers)
    return bad(why, "shm_segment", h.shm_segment,
               "is not a rank of the job's " + std::to_string(num_workers) + " workers");
  return true;
}

}  // namespace fastps
