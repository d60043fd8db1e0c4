// The plain sum under the rack hierarchy (server/rack_relay.h): a part whose server is in
// another rack goes to this rack's relay for that server, as bytes (its route rides where
// a slot reference would, protocol/flags.h); the relay's answer stands for the owner's.
// Parts of this rack's servers take the plain path.
#include "common/trace.h"
#include "protocol/flags.h"
#include "worker/paths/paths.h"
#include "worker/paths/plain.h"

namespace fastps {
namespace {

class RelayedPath final : public PlainPath {
 public:
  using PlainPath::PlainPath;
  const char* name() const override { return "relayed"; }
  void send(PartTask& t) const override;
};

void RelayedPath::send(PartTask& t) const {
  const WorkerOptions& opts = *ctx_.opts;
  uint32_t owner = t.span.server;
  uint32_t via = opts.relay_via[owner];
  if (via == owner) {
    PlainPath::send(t);
    return;
  }
  const Handle& h = *t.handle;
  size_t len = t.span.len;
  const Link& link = link_to(via, t);
  // A local owner's sum lies in its stage until the answer; the bytes go from there.
  Payload p = t.stage.empty() ? Payload::memory(h.in + t.span.offset, len)
                              : Payload::memory(t.stage.data, len);
  FrameHeader hdr = part_header(MsgType::kPush, t, opts.rank);
  hdr.pushers = opts.rack_pushers;
  RelayRoute route;
  route.owner = owner;
  route.owner_pushers = opts.owner_pushers[owner];
  set_relay_route(&hdr, route);
  ctx_.stats->pushed_socket++;
  trace::mark(trace::Mark::kSend, hdr.tensor, hdr.part, via, len);
  // Credits stay the owner's: the relay's answer stands for the owner's.
  if (!write_part(link, hdr, p, via, owner, len))
    ctx_.abort("lost connection to " + link.desc() + " (this rack's relay for server " +
               std::to_string(owner) + ")");
}

}  // namespace

std::unique_ptr<PartPath> make_relayed_path(const PathContext& ctx) {
  return std::make_unique<RelayedPath>(ctx);
}

}  // namespace fastps
