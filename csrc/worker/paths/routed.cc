// Routed and async push_pulls (docs/design/architecture.md, "Bytes on the wire";
// docs/guide/async.md): a push that carries no data (send off) or wants no result
// (receive off), counted against the pushers it names; or an update, init or read of the
// parameters a server keeps. Straight to the servers from the caller's memory: no fusion,
// no local sum, no staging slot.
#include <stdexcept>
#include <string>

#include "common/trace.h"
#include "kernels/sum.h"
#include "protocol/flags.h"
#include "protocol/messages.h"
#include "worker/paths/paths.h"

namespace fastps {
namespace {

class RoutedPath final : public PartPath {
 public:
  using PartPath::PartPath;
  const char* name() const override { return "routed"; }
  bool direct() const override { return true; }
  void check(const PushPullRequest& r) const override;
  void send(PartTask& t) const override;
  void take_result(Connection* c, const FrameHeader& h, const PartTask& t,
                   void* payload) const override;
};

void RoutedPath::check(const PushPullRequest& r) const {
  const WorkerOptions& opts = *ctx_.opts;
  if (!plain_sum(r.mode)) {
    bool reads = r.mode == PushMode::kAsyncRead;
    if (r.pushers || !r.receive || (r.mode == PushMode::kAsyncUpdate && !r.send) ||
        (reads && r.send))
      throw std::invalid_argument(
          "tensor '" + r.name +
          "': an async push_pull receives the parameters, sends data for an update (and "
          "for rank 0's init), none for a read, and names no pushers");
    if (opts.servers.empty())
      throw std::invalid_argument("tensor '" + r.name +
                                  "': async mode keeps parameters on servers; this job has none "
                                  "(a single worker trains locally)");
    if (r.mode == PushMode::kAsyncInit && r.send != (opts.rank == 0))
      throw std::invalid_argument("tensor '" + r.name + "': worker " + std::to_string(opts.rank) +
                                  (r.send ? " sent an async init; only rank 0 sets the value"
                                          : " is rank 0 and must send the initial value"));
  } else {
    if (!r.send && !r.receive)
      throw std::invalid_argument("tensor '" + r.name +
                                  "': a push_pull must send its input or receive the result");
    if ((!r.send || !r.receive) && r.pushers == 0)
      throw std::invalid_argument("tensor '" + r.name +
                                  "': a routed push_pull (send or receive off) must name how "
                                  "many workers push each part (pushers > 0)");
    if (r.pushers > opts.num_workers)
      throw std::invalid_argument(
          "tensor '" + r.name + "': pushers = " + std::to_string(r.pushers) +
          " exceeds the job's " + std::to_string(opts.num_workers) + " workers");
    if (r.pushers && opts.servers.empty())
      throw std::invalid_argument("tensor '" + r.name +
                                  "': a routed push_pull needs servers; this job has none");
  }
  check_compression(r, false);
}

void RoutedPath::send(PartTask& t) const {
  const Handle& h = *t.handle;
  uint32_t server = t.span.server;
  size_t len = t.span.len;
  const Link& link = link_to(server, t);
  FrameHeader hdr = part_header(MsgType::kPush, t, ctx_.opts->rank);
  hdr.pushers = h.pushers;
  if (!h.send) hdr.flags |= kFlagNoData;
  if (!h.receive) hdr.flags |= kFlagNoReply;
  if (h.mode == PushMode::kAsyncUpdate || h.mode == PushMode::kAsyncRead) hdr.flags |= kFlagAsync;
  if (h.mode == PushMode::kAsyncInit) hdr.flags |= kFlagAsyncInit;
  // A compressed outer delta (local SGD / DiLoCo, protocol/messages.h) sends only the bytes
  // its in-band header names; the answer is the whole part.
  size_t wire = h.mode == PushMode::kAsyncUpdate ? outer_wire_len(h.in + t.span.offset, len) : len;
  Payload p = h.send ? Payload::memory(h.in + t.span.offset, wire) : Payload{};
  ctx_.stats->pushed_routed++;
  trace::mark(trace::Mark::kSend, hdr.tensor, hdr.part, server, wire);
  // Credit counts the part's len either way: a want-only header is written at once.
  if (!write_part(link, hdr, p, server, server, len))
    ctx_.abort("lost connection to " + link.desc());
}

void RoutedPath::take_result(Connection* c, const FrameHeader& h, const PartTask& t,
                             void* payload) const {
  // No lag to note: a routed round is not a quorum round. A push that wants no result
  // got an empty answer; one that does has it in its output already.
  const Handle& hd = *t.handle;
  if (hd.receive && hd.scale != 1.0)
    scale(payload, h.len / dtype_size(hd.dtype), hd.dtype, hd.scale);
  trace::mark(trace::Mark::kDone, h.tensor, h.part, h.sender, h.len);
  ctx_.handles->part_done(t.handle);
}

}  // namespace

std::unique_ptr<PartPath> make_routed_path(const PathContext& ctx) {
  return std::make_unique<RoutedPath>(ctx);
}

}  // namespace fastps
