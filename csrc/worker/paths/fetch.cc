// A catch-up fetch under quorum rounds (docs/guide/async.md, "Catch-up"): the plain sum's
// push of the tensor's next round, want-only, which the server answers from its history
// of closed rounds and counts nothing for. It stands for the plain sum, so it is fused
// like one, but it carries no data and is never staged or reduced locally.
#include <stdexcept>
#include <string>

#include "common/trace.h"
#include "protocol/flags.h"
#include "worker/paths/paths.h"

namespace fastps {
namespace {

class FetchPath final : public PartPath {
 public:
  using PartPath::PartPath;
  const char* name() const override { return "fetch"; }
  bool direct() const override { return false; }
  void check(const PushPullRequest& r) const override;
  void send(PartTask& t) const override;
  void take_result(Connection* c, const FrameHeader& h, const PartTask& t,
                   void* payload) const override;
};

void FetchPath::check(const PushPullRequest& r) const {
  const WorkerOptions& opts = *ctx_.opts;
  std::string why;
  if (!opts.quorum)
    why = "quorum rounds are off (FASTPS_ROUND_QUORUM unset): no round closes without it";
  else if (opts.servers.empty())
    why = "this job has no servers";
  else if (ctx_.local_reduce)
    why =
        "its host sums locally first (shared memory on): the servers count hosts; run "
        "with FASTPS_SHM=0";
  else if (!opts.relay_via.empty())
    why = "rack relays sum it (a relayed push is not a quorum round)";
  else if (!r.send || !r.receive || r.pushers || r.compression.enabled())
    why = "a fetch stands for the plain sum: no routing, no compression";
  if (!why.empty())
    throw std::invalid_argument("tensor '" + r.name + "': cannot fetch a closed round: " + why);
}

void FetchPath::send(PartTask& t) const {
  const WorkerOptions& opts = *ctx_.opts;
  uint32_t server = t.span.server;
  size_t len = t.span.len;
  const Link& link = link_to(server, t);
  // The plain sum's header, want-only: the server answers from its history of closed
  // rounds and counts nothing (docs/guide/async.md, "Catch-up").
  FrameHeader hdr = part_header(MsgType::kPush, t, opts.rank);
  hdr.pushers = opts.owner_pushers.empty() ? ctx_.pushers : opts.owner_pushers[server];
  hdr.flags |= kFlagQuorum | kFlagNoData;
  ctx_.stats->pushed_routed++;
  trace::mark(trace::Mark::kSend, hdr.tensor, hdr.part, server, len);
  if (!write_part(link, hdr, Payload{}, server, server, len))
    ctx_.abort("lost connection to " + link.desc());
}

void FetchPath::take_result(Connection* c, const FrameHeader& h, const PartTask& t,
                            void* payload) const {
  // Never staged and never reduced locally (check refuses a local reduce): the closed
  // round's sum is in the output.
  note_lag(h, t);
  finish_in_place(h, t, payload);
}

}  // namespace

std::unique_ptr<PartPath> make_fetch_path(const PathContext& ctx) {
  return std::make_unique<FetchPath>(ctx);
}

}  // namespace fastps
