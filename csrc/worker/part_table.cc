#include "worker/part_table.h"

#include "compression/part_codec.h"

namespace fastps {

PushTicket PartTask::ticket() const {
  PushTicket t;
  t.priority = handle->priority;
  t.tensor = handle->tensor->id;
  t.part = span.index;
  t.server = span.server;
  // A compressed part counts what it puts on the wire (in this round: a sparsity warm-up
  // sends more), so the window keeps as many bytes in flight as for an uncompressed one.
  t.len = handle->compression.enabled()
              ? compressed_bytes(handle->compression.at_round(handle->tensor->rounds),
                                 span.len / dtype_size(handle->dtype))
              : span.len;
  t.tag = handle->id;
  t.light = !handle->compression.enabled();
  return t;
}

FrameHeader part_header(MsgType type, const PartTask& t, uint32_t sender) {
  const Handle& h = *t.handle;
  FrameHeader hdr{};
  hdr.magic = kFrameMagic;
  hdr.type = static_cast<uint8_t>(type);
  hdr.dtype = static_cast<uint8_t>(h.dtype);
  hdr.sender = sender;
  hdr.part = t.span.index;
  hdr.tensor = h.tensor->id;
  hdr.len = t.span.len;
  hdr.tensor_bytes = h.nbytes;
  hdr.round = h.tensor->rounds;
  return hdr;
}

std::string PartTable::add(const std::shared_ptr<Handle>& h,
                           const std::function<bool(uint32_t)>& owned) {
  std::lock_guard<std::mutex> lock(mu_);
  auto failed = failed_tensors_.find(h->tensor->id);
  if (failed != failed_tensors_.end()) return failed->second;
  for (auto& p : h->parts) {
    PartTask t;
    t.handle = h;
    t.span = p;
    t.owned = owned ? owned(p.index) : true;
    pending_[t.key()] = t;
  }
  return "";
}

bool PartTable::contains(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.count(key) != 0;
}

bool PartTable::get(uint64_t key, PartTask* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_.find(key);
  if (it == pending_.end()) return false;
  if (out) *out = it->second;
  return true;
}

bool PartTable::take(uint64_t key, PartTask* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_.find(key);
  if (it == pending_.end()) return false;
  if (out) *out = std::move(it->second);
  pending_.erase(it);
  return true;
}

bool PartTable::mark_in_flight(const PushTicket& t, PartTask* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_.find(part_key(t.tensor, t.part));
  if (it == pending_.end() || it->second.handle->id != t.tag) return false;
  it->second.in_flight = true;
  if (out) *out = it->second;
  return true;
}

void PartTable::set_stage(uint64_t key, const Payload& s, bool mine) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_.find(key);
  if (it == pending_.end()) return;
  (mine ? it->second.mine : it->second.stage) = s;
}

void* PartTable::receive_into(uint64_t key, uint64_t len, bool owned) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_.find(key);
  if (it == pending_.end() || it->second.span.len != len || it->second.owned != owned ||
      !it->second.handle->receive)
    return nullptr;
  const PartTask& t = it->second;
  if (!t.stage.empty()) return t.stage.data;
  return t.handle->out + t.span.offset;
}

bool PartTable::awaits_empty_answer(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_.find(key);
  return it != pending_.end() && it->second.owned && !it->second.handle->receive;
}

std::vector<PartTask> PartTable::fail_tensor(uint64_t tensor, const std::string& msg) {
  std::vector<PartTask> hit;
  std::lock_guard<std::mutex> lock(mu_);
  if (!failed_tensors_.count(tensor)) failed_tensors_[tensor] = msg;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.handle->tensor->id == tensor) {
      hit.push_back(std::move(it->second));
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  return hit;
}

std::vector<PartTask> PartTable::take_all() {
  std::vector<PartTask> all;
  std::lock_guard<std::mutex> lock(mu_);
  all.reserve(pending_.size());
  for (auto& kv : pending_) all.push_back(std::move(kv.second));
  pending_.clear();
  return all;
}

bool PartTable::any(const std::function<bool(const PartTask&)>& pred) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& kv : pending_)
    if (pred(kv.second)) return true;
  return false;
}

}  // namespace fastps
