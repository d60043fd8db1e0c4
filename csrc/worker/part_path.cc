#include "worker/part_path.h"

#include <stdexcept>

#include "common/trace.h"
#include "compression/part_codec.h"
#include "kernels/sum.h"
#include "protocol/flags.h"
#include "worker/paths/paths.h"

namespace fastps {

PathKind path_kind(PushMode mode, bool send, bool receive, uint32_t pushers, bool compressed) {
  // A fetch travels as the plain sum it stands for does, want-only (its own refusals
  // cover routing and compression); async pushes travel as routed ones do.
  if (mode == PushMode::kQuorumFetch) return PathKind::kFetch;
  if (!send || !receive || pushers != 0 || !plain_sum(mode)) return PathKind::kRouted;
  if (compressed) return PathKind::kCompressed;
  return PathKind::kPlain;
}

void* PartPath::receive(Connection* c, const FrameHeader& h, std::string* why) const {
  if (h.flags & kFlagCompressed) {
    *why = "compressed result for a part pushed uncompressed, from " + c->desc();
    return nullptr;
  }
  return receive_in_place(*ctx_.parts, c, h, why);
}

bool PartPath::write_part(const Link& link, const FrameHeader& hdr, const Payload& p, uint32_t to,
                          uint32_t credit_to, size_t credit_len) const {
  return link.send(
      hdr, p,
      [written = &ctx_.written, to, credit_to, credit_len, tensor = hdr.tensor, part = hdr.part] {
        trace::mark(trace::Mark::kWritten, tensor, part, to, credit_len);
        (*written)(credit_to, credit_len);
      });
}

void PartPath::finish_in_place(const FrameHeader& h, const PartTask& t, void* payload) const {
  const Handle& hd = *t.handle;
  if (hd.scale != 1.0) scale(payload, h.len / dtype_size(hd.dtype), hd.dtype, hd.scale);
  trace::mark(trace::Mark::kDone, h.tensor, h.part, h.sender, h.len);
  ctx_.handles->part_done(t.handle);
}

void PartPath::check_compression(const PushPullRequest& r, bool allowed_here) {
  if (!r.compression.enabled()) return;
  if (!compressible(r.dtype))
    throw std::invalid_argument("tensor '" + r.name + "': " + dtype_name(r.dtype) +
                                " cannot be compressed with " + r.compression.describe() +
                                " (float types only)");
  if (!allowed_here)
    throw std::invalid_argument("tensor '" + r.name +
                                "': a routed or async push_pull cannot be compressed");
}

void* receive_in_place(const PartTable& parts, Connection* c, const FrameHeader& h,
                       std::string* why) {
  uint64_t key = part_key(h.tensor, h.part);
  if (h.len == 0) {
    // An empty answer: the round of a part this worker pushed without wanting the result.
    if (!parts.awaits_empty_answer(key))
      *why =
          "empty answer for a part this worker is not waiting for, or whose result it "
          "wants, from " +
          c->desc();
    return nullptr;
  }
  void* dst = parts.receive_into(key, h.len, true);
  if (!dst) *why = "result for a part this worker is not waiting for, from " + c->desc();
  return dst;
}

PartPaths::PartPaths(const PathContext& ctx) {
  bool relays = !ctx.opts->relay_via.empty();
  paths_[static_cast<int>(PathKind::kPlain)] =
      relays ? make_relayed_path(ctx) : make_plain_path(ctx);
  paths_[static_cast<int>(PathKind::kRouted)] = make_routed_path(ctx);
  paths_[static_cast<int>(PathKind::kFetch)] = make_fetch_path(ctx);
  paths_[static_cast<int>(PathKind::kCompressed)] = make_compressed_path(ctx);
}

PartPaths::~PartPaths() = default;

}  // namespace fastps
