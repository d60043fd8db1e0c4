// Gradient compression (docs/guide/compression.md): the push thread encodes each part
// (with this worker's error feedback) and sends it with kFlagCompressed; the server's
// compressed sum comes back encoded, into a buffer of its own, and is decoded into the
// output. Straight to the servers, as a routed push_pull goes; float dtypes only.
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/trace.h"
#include "compression/part_codec.h"
#include "kernels/sum.h"
#include "protocol/flags.h"
#include "worker/paths/paths.h"

namespace fastps {
namespace {

class CompressedPath final : public PartPath {
 public:
  using PartPath::PartPath;
  const char* name() const override { return "compressed"; }
  bool direct() const override { return true; }
  void check(const PushPullRequest& r) const override { check_compression(r, true); }
  void send(PartTask& t) const override;
  void* receive(Connection* c, const FrameHeader& h, std::string* why) const override;
  void take_result(Connection* c, const FrameHeader& h, const PartTask& t,
                   void* payload) const override;

 private:
  // Decodes a compressed answer into the part's output; false (and the job aborts,
  // naming the server) if it is not a valid encoding of the part.
  bool decode_answer(Connection* c, const PartTask& t, const FrameHeader& h,
                     const char* payload) const;
};

void CompressedPath::send(PartTask& t) const {
  const Handle& h = *t.handle;
  uint32_t server = t.span.server;
  size_t len = t.ticket().len;  // the compressed bytes the scheduler counts for it
  size_t n = t.span.len / dtype_size(h.dtype);
  const Link& link = link_to(server, t);
  FrameHeader hdr = part_header(MsgType::kPush, t, ctx_.opts->rank);
  hdr.pushers = 0;  // every worker: compressed parts skip the local reduce
  hdr.flags |= kFlagCompressed;
  // A sparsity warm-up keeps more values in the part's first rounds; every worker is in
  // the same round of the part, so the servers see the same fraction from all of them.
  const CompressionSpec spec = h.compression.at_round(hdr.round);
  auto bytes = encode_part(spec, h.in + t.span.offset, h.dtype, n,
                           round_seed(spec, t.key(), hdr.round, ctx_.opts->rank),
                           spec.error_feedback ? ctx_.error_feedback : nullptr, t.key());
  hdr.len = bytes->size();
  ctx_.stats->pushed_socket++;
  trace::mark(trace::Mark::kSend, hdr.tensor, hdr.part, server, hdr.len);
  if (!write_part(link, hdr, Payload::memory(bytes->data(), bytes->size(), bytes), server, server,
                  len))
    ctx_.abort("lost connection to " + link.desc());
}

void* CompressedPath::receive(Connection* c, const FrameHeader& h, std::string* why) const {
  if (!(h.flags & kFlagCompressed)) {
    *why = "uncompressed result for a part pushed compressed, from " + c->desc();
    return nullptr;
  }
  // The compressed sum lands in a buffer of its own; take_result decodes it into out.
  auto buf = std::make_shared<std::vector<char>>(h.len);
  void* dst = buf->data();
  c->rx_hold = std::move(buf);
  return dst;
}

void CompressedPath::take_result(Connection* c, const FrameHeader& h, const PartTask& t,
                                 void* payload) const {
  if (!(h.flags & kFlagCompressed)) {
    // receive() refused this already; only a part pushed again since could get here.
    ctx_.abort(c->desc() + " answered part " + std::to_string(h.part) + " of tensor '" +
               ctx_.registry->name_of(h.tensor) + "', pushed compressed, uncompressed");
    return;
  }
  note_lag(h, t);
  auto buf = std::static_pointer_cast<std::vector<char>>(std::move(c->rx_hold));
  if (!decode_answer(c, t, h, buf->data())) return;
  trace::mark(trace::Mark::kDone, h.tensor, h.part, h.sender, h.len);
  ctx_.handles->part_done(t.handle);
}

bool CompressedPath::decode_answer(Connection* c, const PartTask& t, const FrameHeader& h,
                                   const char* payload) const {
  const Handle& hd = *t.handle;
  size_t n = t.span.len / dtype_size(hd.dtype);
  char* out = hd.out + t.span.offset;
  // float32 decodes straight into the output; other dtypes through a float32 buffer.
  std::vector<float> tmp(hd.dtype == DType::kFloat32 ? 0 : n);
  float* sum = hd.dtype == DType::kFloat32 ? reinterpret_cast<float*>(out) : tmp.data();
  try {
    decode_part(payload, h.len, n, sum, false);
  } catch (const std::exception& e) {
    ctx_.abort(c->desc() + " answered part " + std::to_string(h.part) + " of tensor '" +
               ctx_.registry->name_of(h.tensor) + "' with a bad compressed sum: " + e.what());
    return false;
  }
  if (hd.scale != 1.0) scale(sum, n, DType::kFloat32, hd.scale);
  if (hd.dtype != DType::kFloat32) from_float(sum, n, hd.dtype, out);
  return true;
}

}  // namespace

std::unique_ptr<PartPath> make_compressed_path(const PathContext& ctx) {
  return std::make_unique<CompressedPath>(ctx);
}

}  // namespace fastps
