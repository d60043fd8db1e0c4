#include "server/param_store.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "common/dtype.h"
#include "common/logging.h"
#include "compression/part_codec.h"
#include "kernels/sum.h"
#include "protocol/flags.h"
#include "transport/link.h"

namespace fastps {

namespace {
// The OuterHeader in front of a pushed part, if it carries a valid one.
bool read_outer(const Payload& data, const FrameHeader& h, OuterHeader* oh) {
  if (h.len < sizeof(OuterHeader) || data.empty()) return false;
  std::memcpy(oh, data.data, sizeof(OuterHeader));
  return oh->magic == kOuterMagic && oh->check == outer_check(*oh);
}

std::string part_text(const FrameHeader& h) {
  std::ostringstream os;
  os << "part " << h.part << " of tensor id " << h.tensor;
  return os.str();
}
}  // namespace

ParamStore::ParamStore(uint32_t num_workers, int64_t staleness, uint32_t server_id, uint32_t quorum,
                       double quorum_fraction, uint32_t quorum_history)
    : num_workers_(num_workers),
      staleness_(staleness),
      server_id_(server_id),
      quorum_(quorum, quorum_fraction, quorum_history, num_workers),
      quorum_on_(quorum_.needed(num_workers) < num_workers) {}

std::string ParamStore::check(const Part& p, const FrameHeader& h, bool shorter) const {
  bool len_ok = shorter ? h.len <= p.value.size() : h.len == p.value.size();
  if (h.dtype == p.dtype && len_ok && h.tensor_bytes == p.tensor_bytes) return "";
  std::ostringstream os;
  os << "async part " << h.part << " of tensor id " << h.tensor << ": worker " << h.sender
     << " sent " << h.len << " bytes of " << dtype_name(static_cast<DType>(h.dtype))
     << " (whole tensor " << h.tensor_bytes << " bytes), the server holds " << p.value.size()
     << " bytes of " << dtype_name(static_cast<DType>(p.dtype)) << " (whole tensor "
     << p.tensor_bytes << " bytes) from rank 0's init";
  return os.str();
}

void ParamStore::answer(const Part& p, const std::shared_ptr<Connection>& conn,
                        const FrameHeader& h) const {
  FrameHeader r = answer_header(h, MsgType::kResult, server_id_);
  r.pushers = 0;
  // A snapshot: the stored value changes with the next update while this answer is written.
  auto snap = std::make_shared<std::vector<char>>(p.value);
  Link(conn, false).send(r, Payload::memory(snap->data(), snap->size(), snap));
}

void ParamStore::refuse(const std::shared_ptr<Connection>& conn, const FrameHeader& h,
                        const std::string& msg) const {
  LOG_WARN("server " << server_id_ << ": " << msg);
  FrameHeader e = answer_header(h, MsgType::kError, server_id_);
  auto text = std::make_shared<std::string>(msg);
  Link(conn, false).send(e, Payload::memory(text->data(), text->size(), text));
}

void ParamStore::release(Part& p) {
  if (p.held.empty()) return;
  uint64_t slowest = *std::min_element(p.clock.begin(), p.clock.end());
  std::vector<Waiter> still;
  for (auto& w : p.held) {
    if (w.clock <= slowest + static_cast<uint64_t>(staleness_))
      answer(p, w.conn, w.hdr);
    else
      still.push_back(std::move(w));
  }
  p.held.swap(still);
}

std::string ParamStore::handle(const std::shared_ptr<Connection>& conn, const FrameHeader& h,
                               const Payload& data) {
  uint64_t key = part_key(h.tensor, h.part);
  Part& p = parts_[key];
  if (p.clock.empty()) p.clock.assign(num_workers_, 0);
  bool carries = !(h.flags & kFlagNoData);
  if (h.flags & kFlagAsyncInit) {
    if (carries) {
      if (h.sender != 0) {
        std::ostringstream os;
        os << "async init of part " << h.part << " of tensor id " << h.tensor << " from worker "
           << h.sender << ": only rank 0 sets the initial parameters";
        return os.str();
      }
      OuterHeader oh;
      if (read_outer(data, h, &oh) && oh.kind == kOuterInit)
        return init_outer(p, conn, h, data, oh);
      if (p.outer) {
        std::ostringstream os;
        os << "async init of " << part_text(h)
           << " without an outer header: the part is trained with an outer optimizer "
              "(local SGD / DiLoCo); reinitialize it through the same algorithm";
        return os.str();
      }
      // Rank 0's value; a later init (a restored checkpoint) replaces it.
      p.value.assign(data.data, data.data + h.len);
      p.dtype = h.dtype;
      p.tensor_bytes = h.tensor_bytes;
      p.ready = true;
      answer(p, conn, h);
      for (auto& w : p.for_value) {
        std::string bad = check(p, w.hdr);
        if (bad.empty())
          answer(p, w.conn, w.hdr);
        else
          refuse(w.conn, w.hdr, bad);
      }
      p.for_value.clear();
      return "";
    }
    if (!p.ready && !p.refused.empty()) return p.refused;  // rank 0's init will not come
    if (!p.ready) {
      p.for_value.push_back(Waiter{conn, h, 0});
      return "";
    }
    std::string bad = check(p, h);
    if (!bad.empty()) return bad;
    answer(p, conn, h);
    return "";
  }
  if (!p.ready) {
    std::ostringstream os;
    os << "async " << (carries ? "update" : "read") << " of part " << h.part << " of tensor id "
       << h.tensor << " from worker " << h.sender
       << " before rank 0 set its initial parameters (init first: "
          "fastps.core.api.async_init / DistributedOptimizer(async=True))";
    return os.str();
  }
  // An outer part's update may be a compressed delta, shorter than the part.
  std::string bad = check(p, h, p.outer && carries);
  if (!bad.empty()) return bad;
  if (!carries) {  // a read: the current parameters, no clock
    answer(p, conn, h);
    return "";
  }
  if (p.outer) return update_outer(p, conn, h, data);
  sum_into(p.value.data(), data.data, h.len / dtype_size(static_cast<DType>(h.dtype)),
           static_cast<DType>(h.dtype));
  updates_++;
  uint64_t c = ++p.clock[h.sender];
  if (staleness_ < 0) {
    answer(p, conn, h);
    return "";
  }
  p.held.push_back(Waiter{conn, h, c});
  release(p);
  for (auto& w : p.held)
    if (w.hdr.sender == h.sender && w.clock == c) {
      held_answers_++;  // this worker is more than s updates ahead: it waits
      break;
    }
  return "";
}

std::string ParamStore::init_outer(Part& p, const std::shared_ptr<Connection>& conn,
                                   const FrameHeader& h, const Payload& data,
                                   const OuterHeader& oh) {
  auto dt = static_cast<DType>(h.dtype);
  std::ostringstream os;
  os << "outer-optimizer init of " << part_text(h) << " from worker " << h.sender << ": ";
  OuterConfig cfg{oh.lr, oh.momentum, (oh.flags & kOuterNesterov) != 0};
  std::string bad = outer_config_error(cfg);
  if (oh.tensor != h.tensor || oh.part != h.part)
    os << "its header names part " << oh.part << " of tensor id " << oh.tensor;
  else if (!bad.empty())
    os << bad;
  else if (!outer_dtype_ok(dt))
    os << "dtype " << dtype_name(dt) << " is not a float type";
  else if (h.len == sizeof(OuterHeader))
    os << "the part holds no elements after its header";
  else
    os.str("");
  if (!os.str().empty()) {
    // The other workers' inits wait for this value: they would wait until their timeout.
    for (auto& w : p.for_value) refuse(w.conn, w.hdr, os.str());
    p.for_value.clear();
    if (!p.ready) p.refused = os.str();
    return os.str();
  }
  p.refused.clear();
  if (p.outer && !p.outer->waiting.empty()) {
    std::ostringstream why;
    why << "rank 0 replaced the parameters of " << part_text(h) << " during outer round "
        << p.outer->round << " (a new init)";
    fail_round(p, why.str());
  }
  size_t count = (h.len - sizeof(OuterHeader)) / dtype_size(dt);
  auto outer = std::make_unique<Outer>(cfg);
  outer->params.resize(count);
  to_double(data.data + sizeof(OuterHeader), dt, count, outer->params.data());
  outer->acc.assign(count, 0.0);
  outer->pushed.assign(num_workers_, false);
  outer->round = oh.round;  // the workers' outer round goes on across a re-init
  p.outer = std::move(outer);
  quorum_.forget(part_key(h.tensor, h.part));  // the rounds kept held the old parameters
  p.value.assign(data.data, data.data + h.len);
  OuterHeader ans = oh;
  ans.kind = kOuterParams;
  ans.check = outer_check(ans);
  std::memcpy(p.value.data(), &ans, sizeof ans);
  p.dtype = h.dtype;
  p.tensor_bytes = h.tensor_bytes;
  p.ready = true;
  answer(p, conn, h);
  for (auto& w : p.for_value) {
    std::string mismatch = check(p, w.hdr);
    if (mismatch.empty())
      answer(p, w.conn, w.hdr);
    else
      refuse(w.conn, w.hdr, mismatch);
  }
  p.for_value.clear();
  return "";
}

void ParamStore::fail_round(Part& p, const std::string& msg) {
  Outer& o = *p.outer;
  for (auto& w : o.waiting) refuse(w.conn, w.hdr, msg);
  o.waiting.clear();
  std::fill(o.acc.begin(), o.acc.end(), 0.0);
  std::fill(o.pushed.begin(), o.pushed.end(), false);
  o.count = 0;
}

std::string ParamStore::update_outer(Part& p, const std::shared_ptr<Connection>& conn,
                                     const FrameHeader& h, const Payload& data) {
  Outer& o = *p.outer;
  OuterHeader oh;
  std::ostringstream os;
  bool has_header = read_outer(data, h, &oh) && oh.kind == kOuterDelta;
  if (has_header && oh.tensor == h.tensor && oh.part == h.part && oh.round < o.round && quorum_on_)
    return late_outer(p, conn, h, oh);  // its round closed without it
  if (!has_header)
    os << "async update of " << part_text(h) << " from worker " << h.sender
       << " carries no outer delta header, but the part is trained with an outer optimizer "
          "(local SGD / DiLoCo): push its deltas through that algorithm";
  else if (oh.tensor != h.tensor || oh.part != h.part)
    os << "outer delta for " << part_text(h) << " from worker " << h.sender
       << ": its header names part " << oh.part << " of tensor id " << oh.tensor;
  else if (oh.round != o.round)
    os << "worker " << h.sender << " pushed its delta of outer round " << oh.round << " for "
       << part_text(h) << ", but the server is in round " << o.round
       << " (every worker must take the same outer steps)";
  else if (o.pushed[h.sender])
    os << "worker " << h.sender << " pushed " << part_text(h) << " twice in outer round "
       << o.round;
  else
    os << add_delta(p, h, data, oh);
  if (!os.str().empty()) {
    // The round cannot complete any more: tell its other pushers now, not at their timeout.
    fail_round(p, os.str());
    return os.str();
  }
  uint64_t key = part_key(h.tensor, h.part);
  o.pushed[h.sender] = true;
  o.count++;
  o.waiting.push_back(Waiter{conn, h, o.round});
  updates_++;
  if (quorum_on_) quorum_.note_push(key, h.sender, o.round);
  if (quorum_on_ ? !quorum_.may_close(key, o.round, o.count, num_workers_) : o.count < num_workers_)
    return "";
  close_round(p, key);
  return "";
}

std::string ParamStore::add_delta(Part& p, const FrameHeader& h, const Payload& data,
                                  const OuterHeader& oh) {
  Outer& o = *p.outer;
  auto dt = static_cast<DType>(h.dtype);
  const char* body = data.data + sizeof(OuterHeader);
  const size_t n = o.acc.size();
  if (!(oh.flags & kOuterCompressed)) {
    if (h.len != p.value.size()) {
      std::ostringstream os;
      os << "outer delta for " << part_text(h) << " from worker " << h.sender << ": " << h.len
         << " bytes, the part holds " << p.value.size();
      return os.str();
    }
    add_as_double(body, dt, n, o.acc.data());
    return "";
  }
  std::ostringstream os;
  os << "compressed outer delta for " << part_text(h) << " from worker " << h.sender << ": ";
  const size_t elem = dtype_size(dt);
  if (oh.wire_len != h.len) {
    os << "its header says " << oh.wire_len << " bytes on the wire, " << h.len << " arrived";
    return os.str();
  }
  try {
    CompressedHeader ch = read_compressed_header(body, h.len - sizeof(OuterHeader));
    if (ch.elements != n) {
      os << "it holds " << ch.elements << " values, the part " << n;
      return os.str();
    }
    // The codec's exact length; the frame pads it to a whole element.
    size_t need = compressed_bytes(spec_of(ch), n);
    size_t framed = (sizeof(OuterHeader) + need + elem - 1) / elem * elem;
    if (framed != h.len) {
      os << h.len << " bytes, " << spec_of(ch).describe() << " of " << n << " values takes "
         << framed;
      return os.str();
    }
    o.decoded.resize(n);
    decode_part(body, need, n, o.decoded.data(), false);
  } catch (const std::exception& e) {
    os << e.what();
    return os.str();
  }
  add_as_double(o.decoded.data(), DType::kFloat32, n, o.acc.data());
  compressed_deltas_++;
  return "";
}

std::string ParamStore::late_outer(Part& p, const std::shared_ptr<Connection>& conn,
                                   const FrameHeader& h, const OuterHeader& oh) {
  Outer& o = *p.outer;
  uint64_t key = part_key(h.tensor, h.part);
  std::string why;
  auto bytes = quorum_.result_of(key, oh.round, &why);
  if (!bytes || bytes->size() != p.value.size()) {
    std::ostringstream os;
    os << "worker " << h.sender << " pushed its delta of outer round " << oh.round << " for "
       << part_text(h) << " late (the server is in round " << o.round
       << "): " << (bytes ? "the part was reinitialized since" : why);
    return os.str();  // refused to its sender only: the open round goes on without it
  }
  // Dropped, as a late gradient of a quorum round is: the round's parameters went out
  // without it, and its sender gets the very bytes the round's pushers got.
  FrameHeader r = answer_header(h, MsgType::kResult, server_id_);
  r.pushers = 0;
  Link(conn, false).send(r, Payload::memory(bytes->data(), bytes->size(), bytes));
  late_outer_++;
  quorum_.note_push(key, h.sender, oh.round);
  // The laggard moved up: the open round may have been waiting for it to be in reach.
  if (o.count > 0 && quorum_.may_close(key, o.round, o.count, num_workers_)) close_round(p, key);
  return "";
}

void ParamStore::close_round(Part& p, uint64_t key) {
  Outer& o = *p.outer;
  auto dt = static_cast<DType>(p.dtype);
  for (double& d : o.acc) d /= o.count;  // the mean of the deltas counted
  o.opt.step(o.params.data(), o.acc.data(), o.params.size());
  uint64_t closed = o.round++;
  outer_steps_++;
  OuterHeader ans;
  std::memcpy(&ans, p.value.data(), sizeof ans);
  ans.round = o.round;
  ans.check = outer_check(ans);
  std::memcpy(p.value.data(), &ans, sizeof ans);
  from_double(o.params.data(), o.params.size(), dt, p.value.data() + sizeof(OuterHeader));
  // One snapshot for every answer: the value changes only at the next round's end.
  auto snap = std::make_shared<std::vector<char>>(p.value);
  if (quorum_on_) quorum_.keep(key, closed, snap);
  for (auto& w : o.waiting) {
    FrameHeader r = w.hdr;
    r.type = static_cast<uint8_t>(MsgType::kResult);
    r.sender = server_id_;
    r.flags = 0;
    r.pushers = 0;
    r.len = snap->size();
    Link(w.conn, false).send(r, Payload::memory(snap->data(), snap->size(), snap));
  }
  o.waiting.clear();
  std::fill(o.acc.begin(), o.acc.end(), 0.0);
  std::fill(o.pushed.begin(), o.pushed.end(), false);
  o.count = 0;
}

}  // namespace fastps
