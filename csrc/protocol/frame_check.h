// Validation of every field of a received frame header, run before any field is
// used (as an index, a size, a dtype, ...). A failing check names the field and
// its value; the receiver then closes that connection and nothing else.
#pragma once
#include <cstdint>
#include <string>

#include "protocol/messages.h"

namespace fastps {

// Checks what holds for every frame whatever the receiver: magic, a known type,
// known flag bits, a payload length within kMaxPartBytes (kMaxTextBytes for
// text frames), and for data frames a valid dtype whose size divides len and a
// part that fits in its tensor.
bool check_frame_header(const FrameHeader& h, std::string* why);

// A server's extra checks on a worker's frame: only kPush/kShmAttach, sent in
// the name of the authenticated rank, waiting for at most num_workers pushes.
bool check_server_frame(const FrameHeader& h, uint32_t peer_rank, uint32_t num_workers,
                        std::string* why);

}  // namespace fastps
