#include "server/param_store.h"

#include <algorithm>
#include <sstream>

#include "common/dtype.h"
#include "common/logging.h"
#include "kernels/sum.h"
#include "protocol/flags.h"
#include "transport/link.h"

namespace fastps {

ParamStore::ParamStore(uint32_t num_workers, int64_t staleness, uint32_t server_id)
    : num_workers_(num_workers), staleness_(staleness), server_id_(server_id) {}

std::string ParamStore::check(const Part& p, const FrameHeader& h) const {
  if (h.dtype == p.dtype && h.len == p.value.size() && h.tensor_bytes == p.tensor_bytes) return "";
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
  std::string bad = check(p, h);
  if (!bad.empty()) return bad;
  if (!carries) {  // a read: the current parameters, no clock
    answer(p, conn, h);
    return "";
  }
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

}  // namespace fastps
