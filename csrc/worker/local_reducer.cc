#include "worker/local_reducer.h"

#include <cstring>
#include <limits>
#include <sstream>

#include "common/thread_name.h"
#include "common/trace.h"
#include "kernels/sum.h"

namespace fastps {

namespace {
// Results first: copying a finished sum out frees its slot and completes a handle.
constexpr int kResultPriority = std::numeric_limits<int>::max();
// Parts up to this size (network parts, small tensors) are copied, summed and handed on
// by the thread that has them (the caller, or the network thread that received a frame);
// larger ones (a host's 1 MiB parts) by this stage, so neither is held up long. Each
// hand-off to the stage costs a wake-up: three of them lay on a small tensor's round
// trip between two local workers (issue 41).
constexpr size_t kInlineBytes = 256 << 10;
}  // namespace

LocalReducer::LocalReducer(Context ctx) : ctx_(ctx) {}

LocalReducer::~LocalReducer() { stop(); }

void LocalReducer::start() {
  thread_ = std::thread([this] {
    name_this_thread("fastps-local");
    run();
  });
}

void LocalReducer::stop() {
  {
    std::lock_guard<std::mutex> lock(jobs_mu_);
    stop_ = true;
  }
  jobs_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void LocalReducer::post(int priority, std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(jobs_mu_);
    jobs_.push(Job{priority, job_seq_++, std::move(fn)});
  }
  jobs_cv_.notify_one();
}

void LocalReducer::here_or_post(size_t bytes, int priority, std::function<void()> fn) {
  if (bytes > kInlineBytes) {
    post(priority, std::move(fn));
    return;
  }
  if (ctx_.failures->error().empty()) fn();  // as run() skips jobs after a failure
}

void LocalReducer::run() {
  std::unique_lock<std::mutex> lock(jobs_mu_);
  while (true) {
    // An internal thread's wait, ended by stop().
    jobs_cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (stop_) return;
    Job job = jobs_.top();
    jobs_.pop();
    lock.unlock();
    if (ctx_.failures->error().empty()) job.fn();
    lock.lock();
  }
}

void LocalReducer::start_parts(const std::shared_ptr<Handle>& h) {
  LocalGroup& group = *ctx_.group;
  for (auto& p : h->parts) {
    PartTask t;
    t.handle = h;
    t.span = p;
    if (group.owner(h->tensor->id, p.index) != ctx_.rank) {
      t.owned = false;
      here_or_post(t.span.len, h->priority, [this, t] { contribute(t); });
      continue;
    }
    OwnerState ready;
    std::string bad;
    {
      std::lock_guard<std::mutex> lock(own_mu_);
      OwnerState& st = owned_[t.key()];
      st.have_task = true;
      st.task = t;
      for (auto& c : st.got)
        if (bad.empty()) bad = check_contribution(t, c.hdr);
      if (bad.empty() && st.got.size() + 1 == group.size()) {
        ready = std::move(st);
        owned_.erase(t.key());
      }
    }
    if (!bad.empty()) {
      ctx_.failures->fail_tensor(h->tensor->id, bad, true);
      return;
    }
    if (ready.have_task)
      here_or_post(t.span.len, h->priority,
                   [this, st = std::make_shared<OwnerState>(std::move(ready))] {
                     reduce_owned(std::move(*st));
                   });
  }
}

void LocalReducer::contribute(const PartTask& task) {
  if (!ctx_.parts->contains(task.key())) return;  // failed meanwhile
  LocalGroup& group = *ctx_.group;
  PartTask t = task;
  size_t len = t.span.len;
  t.mine = group.stage(len, ctx_.pool);
  if (len) std::memcpy(t.mine.data, t.handle->in + t.span.offset, len);
  ctx_.parts->set_stage(t.key(), t.mine, true);  // before the owner can answer
  FrameHeader hdr = part_header(MsgType::kLocalPush, t, ctx_.rank);
  uint32_t owner = group.owner(hdr.tensor, hdr.part);
  const Link& link = group.peer(owner);
  // No slot free: the bytes go over the local socket instead.
  (link.by_slot(t.mine) ? ctx_.stats->contributed_shm : ctx_.stats->contributed_socket)++;
  trace::mark(trace::Mark::kContribute, hdr.tensor, hdr.part, owner, len);
  if (!link.send(hdr, t.mine))
    ctx_.failures->abort("lost connection to local worker " + std::to_string(owner));
}

std::string LocalReducer::check_contribution(const PartTask& t, const FrameHeader& h) const {
  const Handle& own = *t.handle;
  if (h.dtype == static_cast<uint8_t>(own.dtype) && h.len == t.span.len &&
      h.tensor_bytes == own.nbytes && h.round == own.tensor->rounds)
    return "";
  std::ostringstream os;
  os << "tensor '" << own.tensor->name << "': mismatch in part " << t.span.index
     << " between workers on one host: worker " << ctx_.rank << " has " << own.nbytes
     << " bytes of " << dtype_name(own.dtype) << " (round " << own.tensor->rounds << "), worker "
     << h.sender << " has " << h.tensor_bytes << " bytes of "
     << dtype_name(static_cast<DType>(h.dtype)) << " (round " << h.round << ")";
  return os.str();
}

void LocalReducer::offer(Contribution c) {
  uint64_t key = part_key(c.hdr.tensor, c.hdr.part);
  uint64_t tensor = c.hdr.tensor;
  OwnerState ready;
  std::string bad;
  int priority = 0;
  size_t len = c.hdr.len;
  {
    std::lock_guard<std::mutex> lock(own_mu_);
    OwnerState& st = owned_[key];
    if (st.have_task) bad = check_contribution(st.task, c.hdr);
    st.got.push_back(std::move(c));
    if (bad.empty() && st.have_task && st.got.size() + 1 == ctx_.group->size()) {
      priority = st.task.handle->priority;
      ready = std::move(st);
      owned_.erase(key);
    }
  }
  if (!bad.empty()) {
    ctx_.failures->fail_tensor(tensor, bad, true);
    return;
  }
  if (ready.have_task)
    here_or_post(len, priority, [this, st = std::make_shared<OwnerState>(std::move(ready))] {
      reduce_owned(std::move(*st));
    });
}

void LocalReducer::reduce_owned(OwnerState st) {
  PartTask& t = st.task;
  const Handle& h = *t.handle;
  size_t len = t.span.len;
  size_t count = len / dtype_size(h.dtype);
  const char* own = h.in + t.span.offset;
  trace::mark(trace::Mark::kLocalBegin, h.tensor->id, t.span.index, ctx_.rank, len);
  // Sum in place in the first contribution that lies in shared memory; that
  // slot then carries the part to the server and the sum back to everyone.
  size_t home = st.got.size();
  for (size_t i = 0; i < st.got.size(); ++i)
    if (st.got[i].data.in_slot()) {
      home = i;
      break;
    }
  Payload acc;
  if (home < st.got.size()) {
    acc = st.got[home].data;
    if (count) sum_into(acc.data, own, count, h.dtype);
  } else {
    acc = ctx_.group->stage(len, ctx_.pool);
    home = 0;
    if (count) sum_to(acc.data, own, st.got[0].data.data, count, h.dtype);
  }
  for (size_t i = 0; i < st.got.size(); ++i)
    if (i != home && count) sum_into(acc.data, st.got[i].data.data, count, h.dtype);
  t.stage = acc;
  trace::mark(trace::Mark::kLocalEnd, h.tensor->id, t.span.index, ctx_.rank, len);
  ctx_.parts->set_stage(t.key(), acc, false);
  ctx_.stats->reduced_locally++;
  if (ctx_.num_hosts == 1) {
    // Every worker is on this host: the local sum is the total, and a server
    // would only echo it back. Hand it to the local peers straight away.
    if (!ctx_.parts->take(t.key(), nullptr)) return;  // failed meanwhile
    broadcast_result(t);
    return;
  }
  PushTicket ticket = t.ticket();
  ticket.queued_us = steady_us();
  ctx_.push({ticket});
}

void LocalReducer::on_server_result(const PartTask& t) {
  if (ctx_.reduce) {
    // This worker owns the part: hand the global sum to the local peers.
    here_or_post(t.span.len, kResultPriority, [this, t] { broadcast_result(t); });
  } else {
    here_or_post(t.span.len, kResultPriority, [this, t] { finish_from(t, t.stage.data); });
  }
}

void LocalReducer::broadcast_result(const PartTask& t) {
  LocalGroup& group = *ctx_.group;
  const Payload& acc = t.stage;
  // Holds for the owner and every peer that did not create the slot; each
  // drops its hold after copying the sum out (the creator drops its own).
  acc.ref(static_cast<uint32_t>(group.size() - 1));
  FrameHeader hdr = part_header(MsgType::kLocalResult, t, ctx_.rank);
  for (uint32_t r : group.ranks()) {
    if (r == ctx_.rank) continue;
    if (!group.peer(r).send(hdr, acc)) {
      ctx_.failures->abort("lost connection to local worker " + std::to_string(r));
      return;
    }
  }
  finish_from(t, acc.data);
}

void LocalReducer::finish_from(const PartTask& t, const char* src) {
  const Handle& h = *t.handle;
  char* dst = h.out + t.span.offset;
  if (src && src != dst && t.span.len) std::memcpy(dst, src, t.span.len);
  if (h.scale != 1.0) scale(dst, t.span.len / dtype_size(h.dtype), h.dtype, h.scale);
  t.stage.unref();
  if (t.mine.in_slot() && !t.mine.same_slot(t.stage)) t.mine.unref();
  trace::mark(trace::Mark::kDone, h.tensor->id, t.span.index, ctx_.rank, t.span.len);
  ctx_.handles->part_done(t.handle);
}

void* LocalReducer::on_peer_header(Connection* c, const FrameHeader& h, std::string* why) {
  auto type = static_cast<MsgType>(h.type);
  if (type == MsgType::kLocalError) {
    auto text = std::make_shared<std::string>(h.len, '\0');
    void* dst = text->data();
    c->rx_hold = std::move(text);
    return dst;
  }
  if (payload_bytes(h) == 0) return nullptr;  // a slot reference: nothing follows
  if (type == MsgType::kLocalPush) {
    auto buf = ctx_.pool->get(h.len);
    void* dst = buf->data();
    c->rx_hold = std::move(buf);
    return dst;
  }
  void* dst = ctx_.parts->receive_into(part_key(h.tensor, h.part), h.len, false);
  if (!dst) *why = "result for a part this worker is not waiting for, from " + c->desc();
  return dst;
}

void LocalReducer::on_peer_frame(Connection* c, const FrameHeader& h, void* payload) {
  auto type = static_cast<MsgType>(h.type);
  if (h.sender != c->peer().rank) {
    ctx_.failures->abort(c->desc() + " sent a frame in another worker's name");
    return;
  }
  if (type == MsgType::kLocalError) {
    auto text = std::static_pointer_cast<std::string>(std::move(c->rx_hold));
    ctx_.failures->fail_tensor(h.tensor, *text, false);
    return;
  }
  Payload data = received_payload(h, payload, std::move(c->rx_hold), ctx_.group);
  if (data.empty() && h.len > 0) {
    ctx_.failures->abort(c->desc() + " pointed at shared memory outside the local segments");
    return;
  }
  if (type == MsgType::kLocalPush) {
    if (ctx_.group->owner(h.tensor, h.part) != ctx_.rank) {
      ctx_.failures->abort(c->desc() + " sent a part this worker does not own");
      return;
    }
    offer(Contribution{h, data});
    return;
  }
  // kLocalResult: the global sum of a part a peer owns.
  PartTask t;
  if (!ctx_.parts->take(part_key(h.tensor, h.part), &t)) return;
  if (data.in_slot()) {
    t.stage = data;
    here_or_post(t.span.len, kResultPriority, [this, t] { finish_from(t, t.stage.data); });
  } else {
    // Already received straight into the output.
    here_or_post(t.span.len, kResultPriority, [this, t] { finish_from(t, nullptr); });
  }
}

void LocalReducer::drop_tensor(uint64_t tensor, const std::string& msg, bool tell_peers) {
  if (tell_peers && ctx_.reduce) {
    auto text = std::make_shared<std::string>(msg);
    FrameHeader e{};
    e.magic = kFrameMagic;
    e.type = static_cast<uint8_t>(MsgType::kLocalError);
    e.sender = ctx_.rank;
    e.tensor = tensor;
    for (uint32_t r : ctx_.group->ranks())
      if (r != ctx_.rank)
        ctx_.group->peer(r).send(e, Payload::memory(text->data(), text->size(), text));
  }
  std::lock_guard<std::mutex> lock(own_mu_);
  for (auto it = owned_.begin(); it != owned_.end();) {
    if (it->second.have_task && it->second.task.handle->tensor->id == tensor)
      it = owned_.erase(it);
    else
      ++it;
  }
}

bool LocalReducer::waits_on_peer(uint32_t peer) const {
  {
    std::lock_guard<std::mutex> lock(own_mu_);
    if (!owned_.empty()) return true;  // a contribution is still missing
  }
  const LocalGroup& group = *ctx_.group;
  return ctx_.parts->any([&](const PartTask& t) {
    return !t.owned && group.owner(t.handle->tensor->id, t.span.index) == peer;
  });
}

}  // namespace fastps
