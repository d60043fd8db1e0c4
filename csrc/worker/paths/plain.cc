#include "worker/paths/plain.h"

#include <cstring>

#include "common/trace.h"
#include "protocol/flags.h"
#include "worker/local_group.h"
#include "worker/local_reducer.h"
#include "worker/paths/paths.h"

namespace fastps {

void PlainPath::send(PartTask& t) const {
  const Handle& h = *t.handle;
  const WorkerOptions& opts = *ctx_.opts;
  uint32_t server = t.span.server;
  size_t len = t.span.len;
  const Link& link = link_to(server, t);
  if (link.peer_maps_slots() && t.stage.empty() && len > 0) {
    // One worker here: copy the part into this worker's segment (the only copy
    // on the way in); the server sums it where it lies and answers in place.
    // No slot free: the part goes from the user's memory over the socket.
    Payload s = ctx_.local->stage(len, nullptr);
    if (!s.empty()) {
      std::memcpy(s.data, h.in + t.span.offset, len);
      ctx_.parts->set_stage(t.key(), s, false);
      t.stage = s;
    }
  }
  Payload p = t.stage.empty() ? Payload::memory(h.in + t.span.offset, len) : t.stage;
  FrameHeader hdr = part_header(MsgType::kPush, t, opts.rank);
  hdr.pushers = opts.owner_pushers.empty() ? ctx_.pushers : opts.owner_pushers[server];
  // Only a gradient's sum may close without every push (handle.h, PushMode::kQuorumSum).
  if (opts.quorum && h.mode == PushMode::kQuorumSum) hdr.flags |= kFlagQuorum;
  (link.by_slot(p) ? ctx_.stats->pushed_shm : ctx_.stats->pushed_socket)++;
  trace::mark(trace::Mark::kSend, hdr.tensor, hdr.part, server, len);
  if (!write_part(link, hdr, p, server, server, len))
    ctx_.abort("lost connection to " + link.desc());
}

void PlainPath::take_result(Connection* c, const FrameHeader& h, const PartTask& t,
                            void* payload) const {
  note_lag(h, t);
  if (ctx_.local_reduce || !t.stage.empty()) {
    // The sum lies in a staging slot: the local stage copies it out (and, as
    // local owner, hands it to the local peers first).
    ctx_.reducer->on_server_result(t);
    return;
  }
  finish_in_place(h, t, payload);
}

std::unique_ptr<PartPath> make_plain_path(const PathContext& ctx) {
  return std::make_unique<PlainPath>(ctx);
}

}  // namespace fastps
