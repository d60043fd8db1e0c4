#include "server/compressed_sum.h"

#include <sstream>
#include <stdexcept>

#include "common/dtype.h"
#include "common/logging.h"
#include "common/trace.h"
#include "protocol/flags.h"
#include "transport/link.h"

namespace fastps {

CompressedSum::CompressedSum(uint32_t num_workers, uint32_t server_id, Fail fail)
    : num_workers_(num_workers), server_id_(server_id), fail_(std::move(fail)) {}

bool CompressedSum::pending(uint64_t key) const {
  auto it = rounds_.find(key);
  return (it != rounds_.end() && it->second.count > 0) || failed_.count(key);
}

void CompressedSum::fail(uint64_t key, const FrameHeader& h, const std::string& msg) {
  LOG_WARN("server " << server_id_ << ": " << msg);
  rounds_.erase(key);
  failed_[key] = msg;
  if (fail_) fail_(h, msg);
}

static std::string where(const FrameHeader& h) {
  return "part " + std::to_string(h.part) + " of tensor id " + std::to_string(h.tensor);
}

void CompressedSum::handle(const std::shared_ptr<Connection>& conn, const FrameHeader& h,
                           const Payload& data) {
  uint64_t key = part_key(h.tensor, h.part);
  auto failed = failed_.find(key);
  if (failed != failed_.end()) {
    // Already failed: tell this sender too, so it does not wait.
    FrameHeader e = answer_header(h, MsgType::kError, server_id_);
    auto msg = std::make_shared<std::string>(failed->second);
    Link(conn, false).send(e, Payload::memory(msg->data(), msg->size(), msg));
    return;
  }
  Round& r = rounds_[key];
  if (!(h.flags & kFlagCompressed)) {
    std::ostringstream os;
    os << "compression mismatch in " << where(h) << ": worker " << r.first_rank
       << " compressed it with " << spec_of(r.first).describe() << ", worker " << h.sender
       << " pushed it uncompressed";
    fail(key, h, os.str());
    return;
  }
  CompressedHeader ch;
  try {
    ch = read_compressed_header(data.data, h.len);
    size_t elem = dtype_size(static_cast<DType>(h.dtype));
    if (static_cast<uint64_t>(ch.elements) * elem > h.tensor_bytes)
      throw std::invalid_argument("it claims " + std::to_string(ch.elements) +
                                  " values, more than the whole tensor's");
    spec_of(ch).describe();
  } catch (const std::exception& e) {
    fail(key, h,
         "worker " + std::to_string(h.sender) + " pushed a bad compressed " + where(h) + ": " +
             e.what());
    return;
  }
  uint32_t expected = h.pushers ? h.pushers : num_workers_;
  if (r.count == 0) {
    r.first = ch;
    r.first_rank = h.sender;
    r.expected = expected;
    r.dtype = h.dtype;
    r.tensor_bytes = h.tensor_bytes;
    r.round = h.round;
    r.acc.resize(ch.elements);  // the first push's values overwrite it
    r.reply_to.assign(num_workers_, nullptr);
  } else {
    CompressionSpec a = spec_of(r.first), b = spec_of(ch);
    bool seeds_differ = b.codec == Codec::kRandomK && ch.seed != r.first.seed;
    if (a != b || ch.elements != r.first.elements || seeds_differ) {
      std::ostringstream os;
      os << "compression mismatch in " << where(h) << ": worker " << r.first_rank << " compressed "
         << r.first.elements << " values with " << a.describe() << ", worker " << h.sender
         << " compressed " << ch.elements << " values with " << b.describe();
      if (seeds_differ) os << " (random-k seeds differ: the workers are in different rounds)";
      fail(key, h, os.str());
      return;
    }
    if (h.dtype != r.dtype || h.tensor_bytes != r.tensor_bytes || h.round != r.round ||
        expected != r.expected) {
      std::ostringstream os;
      os << "mismatch in " << where(h) << ": worker " << r.first_rank << " pushed "
         << dtype_name(static_cast<DType>(r.dtype)) << " of a " << r.tensor_bytes
         << "-byte tensor in round " << r.round << ", worker " << h.sender << " "
         << dtype_name(static_cast<DType>(h.dtype)) << " of a " << h.tensor_bytes
         << "-byte tensor in round " << h.round;
      fail(key, h, os.str());
      return;
    }
  }
  if (r.reply_to[h.sender]) {
    fail(key, h,
         "worker " + std::to_string(h.sender) + " pushed " + where(h) + " twice in round " +
             std::to_string(h.round));
    return;
  }
  try {
    trace::mark(trace::Mark::kSumBegin, h.tensor, h.part, h.sender, h.len);
    decode_part(data.data, h.len, r.first.elements, r.acc.data(), r.count > 0);
    trace::mark(trace::Mark::kSumEnd, h.tensor, h.part, h.sender, h.len);
  } catch (const std::exception& e) {
    fail(key, h,
         "worker " + std::to_string(h.sender) + " pushed a bad compressed " + where(h) + ": " +
             e.what());
    return;
  }
  r.reply_to[h.sender] = conn;
  if (++r.count < r.expected) return;
  trace::mark(trace::Mark::kAllIn, h.tensor, h.part, h.sender, h.len);
  complete(key, r, h);
}

void CompressedSum::complete(uint64_t key, Round& r, const FrameHeader& h) {
  CompressionSpec spec = spec_of(r.first);
  spec.momentum = 0;  // the workers' momentum correction; the sum gets error feedback only
  // random-k answers on the pushers' indices (the sum has no others); the other codecs
  // draw the server's own seed.
  uint64_t seed =
      spec.codec == Codec::kRandomK ? r.first.seed : round_seed(spec, key, r.round, 0xFFFFFFFFu);
  auto bytes = encode_part(spec, r.acc.data(), DType::kFloat32, r.acc.size(), seed,
                           spec.error_feedback ? &ef_ : nullptr, key);
  FrameHeader a = answer_header(h, MsgType::kResult, server_id_);
  a.flags = kFlagCompressed;
  a.pushers = 0;
  a.len = bytes->size();
  Payload answer = Payload::memory(bytes->data(), bytes->size(), bytes);
  for (uint32_t i = 0; i < num_workers_; ++i) {
    if (!r.reply_to[i]) continue;
    std::function<void()> written;
    if (trace::on())
      written = [tensor = a.tensor, part = a.part, i, len = a.len] {
        trace::mark(trace::Mark::kAnswerWritten, tensor, part, i, len);
      };
    Link(r.reply_to[i], false).send(a, answer, written);
  }
  r.count = 0;
  r.round++;
  std::fill(r.reply_to.begin(), r.reply_to.end(), nullptr);
  parts_summed_++;
}

}  // namespace fastps
