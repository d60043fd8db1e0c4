#include "worker/worker.h"

#include <unistd.h>

#include <chrono>
#include <limits>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "common/logging.h"
#include "kernels/sum.h"
#include "server/engine.h"
#include "transport/handshake.h"
#include "transport/socket.h"

namespace fastps {

namespace {
std::vector<double> weights_or_equal(const WorkerOptions& o) {
  if (!o.server_weights.empty()) {
    if (o.server_weights.size() != o.servers.size())
      throw std::invalid_argument("got " + std::to_string(o.server_weights.size()) +
                                  " server weights for " + std::to_string(o.servers.size()) +
                                  " servers");
    return o.server_weights;
  }
  return std::vector<double>(o.servers.size(), 1.0);
}
}  // namespace

Worker::Worker(WorkerOptions opts)
    : opts_(std::move(opts)), partitioner_(opts_.partition_bytes, weights_or_equal(opts_)) {
  if (opts_.num_workers > 1 && opts_.servers.empty())
    throw std::invalid_argument("a job with more than one worker needs at least one server");
  if (opts_.conns_per_server < 1) opts_.conns_per_server = 1;
  if (!opts_.local_servers.empty() && opts_.local_servers.size() != opts_.servers.size())
    throw std::invalid_argument("got " + std::to_string(opts_.local_servers.size()) +
                                " local_servers flags for " + std::to_string(opts_.servers.size()) +
                                " servers");
  opts_.local_servers.resize(opts_.servers.size(), false);
  if (opts_.local_ranks.empty()) opts_.local_ranks.push_back(opts_.rank);
  pool_ = std::make_shared<BufferPool>();
  bool any_local_server = false;
  for (bool b : opts_.local_servers) any_local_server = any_local_server || b;
  local_reduce_ = opts_.shm && opts_.local_ranks.size() > 1 && !opts_.servers.empty();
  pushers_ = local_reduce_ && opts_.num_hosts ? opts_.num_hosts : opts_.num_workers;
  if (opts_.shm && !opts_.servers.empty() && (local_reduce_ || any_local_server)) {
    LocalGroupOptions lo;
    lo.job_id = opts_.job_id;
    lo.token = opts_.token;
    lo.rank = opts_.rank;
    lo.num_workers = opts_.num_workers;
    lo.local_ranks = local_reduce_ ? opts_.local_ranks : std::vector<uint32_t>{opts_.rank};
    lo.shm_bytes = opts_.shm_bytes;
    lo.timeout_s = opts_.connect_timeout_s;
    local_ = std::make_unique<LocalGroup>(lo);
  }
}

Worker::~Worker() { shutdown(); }

void Worker::start() {
  loop_ = std::make_unique<EventLoop>("worker-io");
  conns_.resize(opts_.servers.size());
  queues_.resize(opts_.servers.size());
  inflight_.assign(opts_.servers.size(), 0);
  unanswered_.assign(opts_.servers.size(), {});
  // Each server's window in proportion to its share of the bytes (window_bytes for an
  // even split): a server that must receive more bytes needs more of them under way.
  std::vector<double> weights = weights_or_equal(opts_);
  double total = 0;
  for (double w : weights) total += w;
  window_.clear();
  for (double w : weights)
    window_.push_back(total > 0 ? static_cast<size_t>(static_cast<double>(opts_.window_bytes) *
                                                      w / total * weights.size())
                                : opts_.window_bytes);
  server_shm_.assign(opts_.servers.size(), false);
  // The segment exists before anyone can ask to map it.
  if (local_) local_->open();
  for (size_t s = 0; s < opts_.servers.size(); ++s) {
    for (int k = 0; k < opts_.conns_per_server; ++k) {
      std::string desc = "server " + std::to_string(s) + " at " + opts_.servers[s];
      int fd = tcp_connect(opts_.servers[s], opts_.connect_timeout_s,
                           static_cast<int>(opts_.notsent_lowat));
      try {
        connect_handshake(fd, opts_.job_id, opts_.token, opts_.rank, static_cast<uint32_t>(k),
                          opts_.connect_timeout_s, desc);
      } catch (...) {
        ::close(fd);
        throw;
      }
      if (s < opts_.pacing_bytes_per_s.size() && opts_.pacing_bytes_per_s[s] > 0)
        set_pacing_rate(fd, opts_.pacing_bytes_per_s[s] / opts_.conns_per_server);
      Peer p;
      p.rank = static_cast<uint32_t>(s);
      p.conn_index = static_cast<uint32_t>(k);
      conns_[s].push_back(std::make_shared<Connection>(fd, p, desc, this));
    }
  }
  std::vector<std::shared_ptr<Connection>> peers;
  if (local_reduce_) peers = local_->connect_peers(this);
  for (auto& per_server : conns_)
    for (auto& c : per_server) loop_->add(c);
  for (auto& c : peers) loop_->add(c);
  loop_->start();
  if (local_) {
    attach_local_servers();
    // Every local peer and colocated server has mapped the segment: drop its
    // name now, so a crash from here on leaves nothing in /dev/shm.
    local_->unlink_own();
    local_thread_ = std::thread([this] { local_loop(); });
  }
  pusher_ = std::thread([this] { push_loop(); });
}

void Worker::attach_local_servers() {
  size_t asked = 0;
  for (size_t s = 0; s < opts_.servers.size(); ++s) {
    if (!opts_.local_servers[s]) continue;
    FrameHeader h{};
    h.magic = kFrameMagic;
    h.type = static_cast<uint8_t>(MsgType::kShmAttach);
    h.sender = opts_.rank;
    h.shm_segment = opts_.rank;
    if (conns_[s][0]->send(h, nullptr, 0)) ++asked;
  }
  std::unique_lock<std::mutex> lock(attach_mu_);
  bool ok = attach_cv_.wait_for(lock, std::chrono::duration<double>(opts_.connect_timeout_s),
                                [&] { return attach_replies_ >= asked || !error().empty(); });
  if (!error().empty()) throw std::runtime_error(error());
  if (!ok)
    throw std::runtime_error("worker " + std::to_string(opts_.rank) +
                             ": colocated servers did not answer the shared-memory attach");
}

std::vector<std::tuple<size_t, size_t, uint32_t>> Worker::part_layout(const std::string& name,
                                                                       size_t nbytes,
                                                                       size_t elem) const {
  std::vector<std::tuple<size_t, size_t, uint32_t>> out;
  for (auto& p : partitioner_.split(tensor_id_of(name), nbytes, elem))
    out.emplace_back(p.offset, p.len, p.server);
  return out;
}

int64_t Worker::push_pull(const void* in, void* out, size_t nbytes, DType dt,
                          const std::string& name, int priority, double scale) {
  return push_pull_group({PushPullRequest{in, out, nbytes, dt, name, priority, scale}}).front();
}

std::vector<int64_t> Worker::push_pull_group(const std::vector<PushPullRequest>& reqs) {
  {
    std::lock_guard<std::mutex> lock(err_mu_);
    if (!error_.empty()) throw std::runtime_error(error_);
  }
  for (auto& r : reqs) {
    size_t elem = dtype_size(r.dtype);
    if (r.nbytes % elem != 0)
      throw std::invalid_argument("tensor '" + r.name + "': " + std::to_string(r.nbytes) +
                                  " bytes is not a whole number of " + dtype_name(r.dtype) +
                                  " elements");
  }
  // Mark every name busy first; a clash (a name in flight, twice in the group)
  // undoes the others, so a bad group starts nothing.
  std::vector<TensorEntry*> entries;
  entries.reserve(reqs.size());
  try {
    for (auto& r : reqs) entries.push_back(registry_.begin(r.name));
  } catch (...) {
    for (auto* e : entries) registry_.finish(e, false);
    throw;
  }
  std::vector<std::shared_ptr<Handle>> hs;
  hs.reserve(reqs.size());
  std::vector<int64_t> ids;
  ids.reserve(reqs.size());
  {
    std::lock_guard<std::mutex> lock(handles_mu_);
    for (size_t i = 0; i < reqs.size(); ++i) {
      const PushPullRequest& r = reqs[i];
      auto h = std::make_shared<Handle>();
      h->tensor = entries[i];
      h->in = static_cast<const char*>(r.in);
      h->out = static_cast<char*>(r.out);
      h->nbytes = r.nbytes;
      h->dtype = r.dtype;
      h->scale = r.scale;
      h->priority = r.priority;
      h->id = next_handle_++;
      handles_[h->id] = h;
      ids.push_back(h->id);
      hs.push_back(std::move(h));
    }
  }
  // Handles with parts to move; the others finish here.
  std::vector<std::shared_ptr<Handle>> moving;
  moving.reserve(hs.size());
  for (auto& h : hs) {
    size_t elem = dtype_size(h->dtype);
    if (opts_.servers.empty()) {
      // Single worker, no servers: the sum is the input itself.
      if (h->out != h->in && h->nbytes) std::memmove(h->out, h->in, h->nbytes);
      if (h->scale != 1.0) fastps::scale(h->out, h->nbytes / elem, h->dtype, h->scale);
      registry_.finish(h->tensor, true);
      h->finish("");
      continue;
    }
    h->parts = partitioner_.split(h->tensor->id, h->nbytes, elem);
    h->remaining = static_cast<uint32_t>(h->parts.size());
    if (h->parts.empty()) {
      registry_.finish(h->tensor, true);
      h->finish("");
      continue;
    }
    moving.push_back(h);
  }
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    size_t kept = 0;
    for (auto& h : moving) {
      auto failed = failed_tensors_.find(h->tensor->id);
      if (failed != failed_tensors_.end()) {
        registry_.finish(h->tensor, false);
        h->finish(failed->second);
        continue;
      }
      for (auto& p : h->parts) {
        PartTask t{h, p, 0, true, {}, {}, false};
        if (local_reduce_) t.owned = local_->owner(h->tensor->id, p.index) == opts_.rank;
        pending_[part_key(h->tensor->id, p.index)] = t;
      }
      moving[kept++] = h;
    }
    moving.resize(kept);
  }
  if (local_reduce_) {
    for (auto& h : moving) start_local_reduce(h);
    return ids;
  }
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    for (auto& h : moving)
      for (auto& p : h->parts) queues_[p.server].push(PartTask{h, p, seq_++, true, {}, {}, false});
  }
  q_cv_.notify_one();
  return ids;
}

// Local reduce: hands the parts this worker does not own to their local owners
// and registers as the owner of the rest (contributions may already be waiting).
void Worker::start_local_reduce(const std::shared_ptr<Handle>& h) {
  for (auto& p : h->parts) {
    PartTask t{h, p, 0, true, {}, {}, false};
    if (local_->owner(h->tensor->id, p.index) != opts_.rank) {
      t.owned = false;
      post_local(h->priority, [this, t] { contribute(t); });
      continue;
    }
    OwnerState ready;
    std::string bad;
    {
      std::lock_guard<std::mutex> lock(own_mu_);
      OwnerState& st = owned_[part_key(h->tensor->id, p.index)];
      st.have_task = true;
      st.task = t;
      for (auto& c : st.got)
        if (bad.empty()) bad = check_contribution(t, c.hdr);
      if (bad.empty() && st.got.size() + 1 == local_->size()) {
        ready = std::move(st);
        owned_.erase(part_key(h->tensor->id, p.index));
      }
    }
    if (!bad.empty()) {
      fail_tensor(h->tensor->id, bad, true);
      return;
    }
    if (ready.have_task)
      post_local(h->priority, [this, st = std::make_shared<OwnerState>(std::move(ready))] {
        reduce_owned(std::move(*st));
      });
  }
}

// Two limits per server keep the pushes in priority order and the workers in step:
// - credit_bytes: bytes handed to the socket but not yet written to it. Kernel
//   buffers are first come first served; what does not fit waits in the queue,
//   where a late urgent part can still overtake it.
// - window_bytes: bytes of unanswered parts more urgent than the next one. A part
//   is answered only when every worker pushed it, so a worker whose flow to a
//   server runs ahead (TCP shares a link unevenly) waits for the others and its
//   link carries parts for its other servers meanwhile. Counting only more urgent
//   parts keeps this free of deadlock although workers can start in different
//   orders: take the most urgent part that is pushed somewhere and not answered;
//   every worker that has not pushed it has it, or something more urgent, at the
//   head of its queue, and nothing unanswered ahead of that, so it may push it.
bool Worker::window_open(size_t s) const {
  if (queues_[s].empty()) return false;
  const PartTask& next = queues_[s].top();
  size_t len = next.span.len;
  if (inflight_[s] != 0 && inflight_[s] + len > opts_.credit_bytes) return false;
  if (opts_.window_bytes == 0) return true;
  UrgencyKey key = urgency(next);
  size_t ahead = 0;
  for (auto& kv : unanswered_[s]) {
    if (!(kv.first < key)) break;
    ahead += kv.second;
  }
  return ahead == 0 || ahead + len <= window_[s];
}

void Worker::push_loop() {
  std::vector<PartTask> batch;
  std::unique_lock<std::mutex> lock(q_mu_);
  while (true) {
    batch.clear();
    q_cv_.wait(lock, [&] {
      if (stop_) return true;
      for (size_t s = 0; s < queues_.size(); ++s)
        if (window_open(s)) return true;
      return false;
    });
    if (stop_) return;
    while (true) {
      // The most urgent part among the servers that admit one.
      size_t best = queues_.size();
      for (size_t s = 0; s < queues_.size(); ++s)
        if (window_open(s) && (best == queues_.size() ||
                               urgency(queues_[s].top()) < urgency(queues_[best].top())))
          best = s;
      if (best == queues_.size()) break;
      auto& q = queues_[best];
      if (take_off_queue(q.top())) {
        inflight_[best] += q.top().span.len;
        unanswered_[best][urgency(q.top())] = q.top().span.len;
        batch.push_back(q.top());
        batch.back().in_flight = true;
      }
      q.pop();
    }
    lock.unlock();
    for (auto& t : batch) send_part(t);
    lock.lock();
  }
}

bool Worker::take_off_queue(const PartTask& t) {
  std::lock_guard<std::mutex> lock(pending_mu_);
  auto it = pending_.find(part_key(t.handle->tensor->id, t.span.index));
  if (it == pending_.end()) return false;
  it->second.in_flight = true;
  return true;
}

void Worker::release_credit(const PartTask& t) {
  if (!t.in_flight) return;
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    unanswered_[t.span.server].erase(urgency(t));
  }
  q_cv_.notify_one();
}

FrameHeader Worker::header_for(MsgType type, const PartTask& t) const {
  const Handle& h = *t.handle;
  FrameHeader hdr{};
  hdr.magic = kFrameMagic;
  hdr.type = static_cast<uint8_t>(type);
  hdr.dtype = static_cast<uint8_t>(h.dtype);
  hdr.sender = opts_.rank;
  hdr.part = t.span.index;
  hdr.tensor = h.tensor->id;
  hdr.len = t.span.len;
  hdr.tensor_bytes = h.nbytes;
  hdr.round = h.tensor->rounds;
  return hdr;
}

void Worker::set_stage(uint64_t key, const Staging& s, bool mine) {
  std::lock_guard<std::mutex> lock(pending_mu_);
  auto it = pending_.find(key);
  if (it == pending_.end()) return;
  (mine ? it->second.mine : it->second.stage) = s;
}

void Worker::send_part(PartTask t) {
  const Handle& h = *t.handle;
  uint32_t server = t.span.server;
  size_t len = t.span.len;
  bool via_shm = server_shm_[server] && len > 0;
  if (via_shm && t.stage.empty()) {
    // One worker here: copy the part into this worker's segment (the only copy
    // on the way in); the server sums it where it lies and answers in place.
    Staging s = local_->stage(len, nullptr);
    if (!s.empty()) {
      std::memcpy(s.data, h.in + t.span.offset, len);
      set_stage(part_key(h.tensor->id, t.span.index), s, false);
      t.stage = s;
    }
  }
  via_shm = via_shm && t.stage.in_shm();
  auto& per_server = conns_[server];
  auto& conn = per_server[(t.span.index + (h.tensor->id >> 3)) % per_server.size()];
  FrameHeader hdr = header_for(MsgType::kPush, t);
  hdr.pushers = pushers_;
  auto written = [this, server, len] {
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      inflight_[server] -= len;
    }
    q_cv_.notify_one();
  };
  bool ok;
  if (via_shm) {
    hdr.flags = kFlagShm;
    hdr.shm_segment = t.stage.segment;
    hdr.shm_offset = t.stage.offset;
    ok = conn->send(hdr, nullptr, 0, written);
    stats_.pushed_shm++;
  } else {
    stats_.pushed_socket++;
    const char* src = t.stage.empty() ? h.in + t.span.offset : t.stage.data;
    ok = conn->send(hdr, src, len, written);
  }
  if (!ok) abort("lost connection to " + conn->desc());
}

void* Worker::on_header(Connection* c, const FrameHeader& h, std::string* why) {
  auto type = static_cast<MsgType>(h.type);
  bool from_peer = local_reduce_ && local_->is_peer(c);
  if (from_peer != (type == MsgType::kLocalPush || type == MsgType::kLocalResult ||
                    type == MsgType::kLocalError)) {
    *why = "unexpected frame type " + std::to_string(h.type) + " from " + c->desc();
    return nullptr;
  }
  if (type == MsgType::kError || type == MsgType::kFatal || type == MsgType::kShmAttached ||
      type == MsgType::kLocalError) {
    auto text = std::make_shared<std::string>(h.len, '\0');
    void* dst = text->data();
    c->rx_hold = std::move(text);
    return dst;
  }
  if (h.flags & kFlagShm) return nullptr;  // nothing follows the header
  if (type == MsgType::kLocalPush) {
    auto buf = pool_->get(h.len);
    void* dst = buf->data();
    c->rx_hold = std::move(buf);
    return dst;
  }
  if (type != MsgType::kResult && type != MsgType::kLocalResult) {
    *why = "unexpected frame type " + std::to_string(h.type) + " from " + c->desc();
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(pending_mu_);
  auto it = pending_.find(part_key(h.tensor, h.part));
  if (it == pending_.end() || it->second.span.len != h.len ||
      it->second.owned != (type == MsgType::kResult)) {
    *why = "result for a part this worker is not waiting for, from " + c->desc();
    return nullptr;
  }
  const PartTask& t = it->second;
  if (!t.stage.empty()) return t.stage.data;
  return t.handle->out + t.span.offset;
}

void Worker::fail_tensor(uint64_t tensor, const std::string& msg, bool tell_peers) {
  if (tell_peers && local_reduce_) {
    auto text = std::make_shared<std::string>(msg);
    FrameHeader e{};
    e.magic = kFrameMagic;
    e.type = static_cast<uint8_t>(MsgType::kLocalError);
    e.sender = opts_.rank;
    e.tensor = tensor;
    e.len = text->size();
    for (uint32_t r : local_->ranks())
      if (r != opts_.rank) local_->peer(r)->send(e, text->data(), text->size(), [text] {});
  }
  {
    std::lock_guard<std::mutex> lock(own_mu_);
    for (auto it = owned_.begin(); it != owned_.end();) {
      if (it->second.have_task && it->second.task.handle->tensor->id == tensor)
        it = owned_.erase(it);
      else
        ++it;
    }
  }
  std::vector<std::shared_ptr<Handle>> hit;
  std::vector<PartTask> sent;
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    if (!failed_tensors_.count(tensor)) failed_tensors_[tensor] = msg;
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.handle->tensor->id == tensor) {
        hit.push_back(it->second.handle);
        if (it->second.in_flight) sent.push_back(it->second);
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& t : sent) release_credit(t);
  for (auto& hd : hit) fail_handle(hd, msg);
}

void Worker::on_frame(Connection* c, const FrameHeader& h, void* payload) {
  auto type = static_cast<MsgType>(h.type);
  if (type == MsgType::kFatal) {
    auto text = std::static_pointer_cast<std::string>(std::move(c->rx_hold));
    abort(*text);
    return;
  }
  if (type == MsgType::kShmAttached) {
    auto text = std::static_pointer_cast<std::string>(std::move(c->rx_hold));
    if (!text->empty()) {
      LOG_WARN("worker " << opts_.rank << ": " << c->desc()
                         << " cannot map this worker's shared memory (" << *text
                         << "); its parts go over TCP");
    } else {
      server_shm_[c->peer().rank] = true;
    }
    {
      std::lock_guard<std::mutex> lock(attach_mu_);
      attach_replies_++;
    }
    attach_cv_.notify_all();
    return;
  }
  if (type == MsgType::kError) {
    auto text = std::static_pointer_cast<std::string>(std::move(c->rx_hold));
    fail_tensor(h.tensor, "tensor '" + registry_.name_of(h.tensor) + "': " + *text, false);
    return;
  }
  if (local_reduce_ && local_->is_peer(c)) {
    on_local_frame(c, h, payload);
    return;
  }
  PartTask t;
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    auto it = pending_.find(part_key(h.tensor, h.part));
    if (it == pending_.end()) return;
    t = it->second;
    pending_.erase(it);
  }
  release_credit(t);
  if ((h.flags & kFlagShm) &&
      (!t.stage.in_shm() || h.shm_segment != t.stage.segment || h.shm_offset != t.stage.offset)) {
    abort(c->desc() + " answered part " + std::to_string(h.part) + " of tensor '" +
          registry_.name_of(h.tensor) + "' in the wrong shared-memory slot");
    return;
  }
  if (local_reduce_) {
    // This worker owns the part: hand the global sum to the local peers.
    post_local(std::numeric_limits<int>::max(), [this, t] { broadcast_result(t); });
  } else if (!t.stage.empty()) {
    post_local(std::numeric_limits<int>::max(), [this, t] { finish_from(t, t.stage.data); });
  } else {
    if (t.handle->scale != 1.0)
      scale(payload, h.len / dtype_size(t.handle->dtype), t.handle->dtype, t.handle->scale);
    part_done(t.handle);
  }
}

// ---- local stage -----------------------------------------------------------

void Worker::post_local(int priority, std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(lq_mu_);
    local_jobs_.push(LocalJob{priority, local_seq_++, std::move(fn)});
  }
  lq_cv_.notify_one();
}

void Worker::local_loop() {
  std::unique_lock<std::mutex> lock(lq_mu_);
  while (true) {
    lq_cv_.wait(lock, [&] { return local_stop_ || !local_jobs_.empty(); });
    if (local_stop_) return;
    LocalJob job = local_jobs_.top();
    local_jobs_.pop();
    lock.unlock();
    if (error().empty()) job.fn();
    lock.lock();
  }
}

void Worker::contribute(const PartTask& task) {
  uint64_t key = part_key(task.handle->tensor->id, task.span.index);
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    if (!pending_.count(key)) return;  // failed meanwhile
  }
  PartTask t = task;
  size_t len = t.span.len;
  t.mine = local_->stage(len, pool_.get());
  if (len) std::memcpy(t.mine.data, t.handle->in + t.span.offset, len);
  set_stage(key, t.mine, true);  // before the owner can answer
  FrameHeader hdr = header_for(MsgType::kLocalPush, t);
  uint32_t owner = local_->owner(hdr.tensor, hdr.part);
  bool ok;
  if (t.mine.in_shm()) {
    hdr.flags = kFlagShm;
    hdr.shm_segment = t.mine.segment;
    hdr.shm_offset = t.mine.offset;
    ok = local_->peer(owner)->send(hdr, nullptr, 0);
    stats_.contributed_shm++;
  } else {
    stats_.contributed_socket++;
    auto heap = t.mine.heap;  // no slot free: the bytes go over the local socket
    ok = local_->peer(owner)->send(hdr, t.mine.data, len, [heap] {});
  }
  if (!ok) abort("lost connection to local worker " + std::to_string(owner));
}

std::string Worker::check_contribution(const PartTask& t, const FrameHeader& h) const {
  const Handle& own = *t.handle;
  if (h.dtype == static_cast<uint8_t>(own.dtype) && h.len == t.span.len &&
      h.tensor_bytes == own.nbytes && h.round == own.tensor->rounds)
    return "";
  std::ostringstream os;
  os << "tensor '" << own.tensor->name << "': mismatch in part " << t.span.index
     << " between workers on one host: worker " << opts_.rank << " has " << own.nbytes
     << " bytes of " << dtype_name(own.dtype) << " (round " << own.tensor->rounds
     << "), worker " << h.sender << " has " << h.tensor_bytes << " bytes of "
     << dtype_name(static_cast<DType>(h.dtype)) << " (round " << h.round << ")";
  return os.str();
}

void Worker::offer(Contribution c) {
  uint64_t key = part_key(c.hdr.tensor, c.hdr.part);
  OwnerState ready;
  std::string bad;
  int priority = 0;
  {
    std::lock_guard<std::mutex> lock(own_mu_);
    OwnerState& st = owned_[key];
    if (st.have_task) bad = check_contribution(st.task, c.hdr);
    st.got.push_back(std::move(c));
    if (bad.empty() && st.have_task && st.got.size() + 1 == local_->size()) {
      priority = st.task.handle->priority;
      ready = std::move(st);
      owned_.erase(key);
    }
  }
  if (!bad.empty()) {
    fail_tensor(c.hdr.tensor, bad, true);
    return;
  }
  if (ready.have_task)
    post_local(priority, [this, st = std::make_shared<OwnerState>(std::move(ready))] {
      reduce_owned(std::move(*st));
    });
}

void Worker::reduce_owned(OwnerState st) {
  PartTask& t = st.task;
  const Handle& h = *t.handle;
  size_t len = t.span.len;
  size_t count = len / dtype_size(h.dtype);
  const char* own = h.in + t.span.offset;
  // Sum in place in the first contribution that lies in shared memory; that
  // slot then carries the part to the server and the sum back to everyone.
  size_t home = st.got.size();
  for (size_t i = 0; i < st.got.size(); ++i)
    if (st.got[i].data.in_shm()) {
      home = i;
      break;
    }
  Staging acc;
  if (home < st.got.size()) {
    acc = st.got[home].data;
    if (count) sum_into(acc.data, own, count, h.dtype);
  } else {
    acc = local_->stage(len, pool_.get());
    home = 0;
    if (count) sum_to(acc.data, own, st.got[0].data.data, count, h.dtype);
  }
  for (size_t i = 0; i < st.got.size(); ++i)
    if (i != home && count) sum_into(acc.data, st.got[i].data.data, count, h.dtype);
  t.stage = acc;
  set_stage(part_key(h.tensor->id, t.span.index), acc, false);
  stats_.reduced_locally++;
  if (opts_.num_hosts == 1) {
    // Every worker is on this host: the local sum is the total, and a server
    // would only echo it back. Hand it to the local peers straight away.
    {
      std::lock_guard<std::mutex> lock(pending_mu_);
      auto it = pending_.find(part_key(h.tensor->id, t.span.index));
      if (it == pending_.end()) return;  // failed meanwhile
      pending_.erase(it);
    }
    broadcast_result(t);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    t.seq = seq_++;
    queues_[t.span.server].push(t);
  }
  q_cv_.notify_one();
}

void Worker::broadcast_result(const PartTask& t) {
  const Staging& acc = t.stage;
  // Holds for the owner and every peer that did not create the slot; each
  // drops its hold after copying the sum out (the creator drops its own).
  local_->ref(acc, static_cast<uint32_t>(local_->size() - 1));
  FrameHeader hdr = header_for(MsgType::kLocalResult, t);
  if (acc.in_shm()) {
    hdr.flags = kFlagShm;
    hdr.shm_segment = acc.segment;
    hdr.shm_offset = acc.offset;
  }
  for (uint32_t r : local_->ranks()) {
    if (r == opts_.rank) continue;
    bool ok = acc.in_shm() ? local_->peer(r)->send(hdr, nullptr, 0)
                           : local_->peer(r)->send(hdr, acc.data, t.span.len,
                                                   [heap = acc.heap] {});
    if (!ok) {
      abort("lost connection to local worker " + std::to_string(r));
      return;
    }
  }
  finish_from(t, acc.data);
}

void Worker::finish_from(const PartTask& t, const char* src) {
  const Handle& h = *t.handle;
  char* dst = h.out + t.span.offset;
  if (src && src != dst && t.span.len) std::memcpy(dst, src, t.span.len);
  if (h.scale != 1.0) scale(dst, t.span.len / dtype_size(h.dtype), h.dtype, h.scale);
  if (local_) {
    local_->unref(t.stage);
    if (t.mine.in_shm() && !(t.mine.segment == t.stage.segment && t.mine.offset == t.stage.offset))
      local_->unref(t.mine);
  }
  part_done(t.handle);
}

void Worker::on_local_frame(Connection* c, const FrameHeader& h, void* payload) {
  auto type = static_cast<MsgType>(h.type);
  if (h.sender != c->peer().rank) {
    abort(c->desc() + " sent a frame in another worker's name");
    return;
  }
  if (type == MsgType::kLocalError) {
    auto text = std::static_pointer_cast<std::string>(std::move(c->rx_hold));
    fail_tensor(h.tensor, *text, false);
    return;
  }
  Staging data;
  if (h.flags & kFlagShm) {
    data.segment = h.shm_segment;
    data.offset = h.shm_offset;
    data.data = local_->resolve(h.shm_segment, h.shm_offset, h.len);
    if (!data.data) {
      abort(c->desc() + " pointed at shared memory outside the local segments");
      return;
    }
  } else if (type == MsgType::kLocalPush) {
    data.heap = std::static_pointer_cast<Buffer>(std::move(c->rx_hold));
    data.data = data.heap ? static_cast<char*>(data.heap->data()) : nullptr;
  }
  if (type == MsgType::kLocalPush) {
    if (local_->owner(h.tensor, h.part) != opts_.rank) {
      abort(c->desc() + " sent a part this worker does not own");
      return;
    }
    offer(Contribution{h, data});
    return;
  }
  // kLocalResult: the global sum of a part a peer owns.
  PartTask t;
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    auto it = pending_.find(part_key(h.tensor, h.part));
    if (it == pending_.end()) return;
    t = it->second;
    pending_.erase(it);
  }
  if (data.in_shm()) {
    t.stage = data;
    post_local(std::numeric_limits<int>::max(), [this, t] { finish_from(t, t.stage.data); });
  } else {
    // Already received straight into the output.
    post_local(std::numeric_limits<int>::max(), [this, t] { finish_from(t, nullptr); });
  }
}

void Worker::part_done(const std::shared_ptr<Handle>& h) {
  if (h->remaining.fetch_sub(1) == 1) {
    registry_.finish(h->tensor, true);
    h->finish("");
  }
}

void Worker::fail_handle(const std::shared_ptr<Handle>& h, const std::string& msg) {
  bool was_running;
  {
    std::lock_guard<std::mutex> lock(h->mu);
    was_running = !h->done;
  }
  if (was_running && h->finish(msg)) registry_.finish(h->tensor, false);
}

void Worker::on_close(Connection* c, bool clean, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(err_mu_);
    if (shutting_down_) return;
  }
  if (local_reduce_ && local_->is_peer(c)) {
    uint32_t peer = c->peer().rank;
    if (clean && !waits_on_peer(peer)) return;  // it finished its work and left
    abort("lost connection to local worker " + std::to_string(peer) +
          (clean ? " (same host; it shut down while parts still needed it)"
                 : " (same host; it exited or was killed)") +
          ": " + reason);
    return;
  }
  abort("lost connection to " + c->desc() + ": " + reason);
}

bool Worker::waits_on_peer(uint32_t peer) {
  {
    std::lock_guard<std::mutex> lock(own_mu_);
    if (!owned_.empty()) return true;  // a contribution is still missing
  }
  std::lock_guard<std::mutex> lock(pending_mu_);
  for (auto& kv : pending_)
    if (!kv.second.owned &&
        local_->owner(kv.second.handle->tensor->id, kv.second.span.index) == peer)
      return true;
  return false;
}

void Worker::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(err_mu_);
    if (!error_.empty()) return;
    error_ = reason;
  }
  LOG_WARN("worker " << opts_.rank << " aborting: " << reason);
  std::vector<std::shared_ptr<Handle>> all;
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    for (auto& kv : pending_) all.push_back(kv.second.handle);
    pending_.clear();
  }
  {
    std::lock_guard<std::mutex> lock(handles_mu_);
    for (auto& kv : handles_) all.push_back(kv.second);
  }
  for (auto& h : all) fail_handle(h, reason);
}

std::string Worker::error() const {
  std::lock_guard<std::mutex> lock(err_mu_);
  return error_;
}

std::shared_ptr<Handle> Worker::get(int64_t id) const {
  std::lock_guard<std::mutex> lock(handles_mu_);
  auto it = handles_.find(id);
  if (it == handles_.end())
    throw std::invalid_argument("unknown or already synchronized handle " + std::to_string(id));
  return it->second;
}

bool Worker::poll(int64_t id) {
  auto h = get(id);
  std::lock_guard<std::mutex> lock(h->mu);
  return h->done;
}

void Worker::wait(int64_t id, double timeout_s) {
  auto h = get(id);
  std::unique_lock<std::mutex> lock(h->mu);
  bool ok = h->cv.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return h->done; });
  if (!ok) {
    lock.unlock();
    std::ostringstream os;
    os << "push_pull of tensor '" << h->tensor->name << "' on worker " << opts_.rank
       << " did not complete within " << timeout_s << " s (" << h->remaining.load() << " of "
       << h->parts.size()
       << " parts outstanding); another worker may not have submitted this tensor";
    abort(os.str());
    release(id);
    throw std::runtime_error(os.str());
  }
  std::string err = h->error;
  lock.unlock();
  release(id);
  if (!err.empty()) throw std::runtime_error(err);
}

void Worker::release(int64_t id) {
  std::lock_guard<std::mutex> lock(handles_mu_);
  handles_.erase(id);
}

void Worker::shutdown() {
  {
    std::lock_guard<std::mutex> lock(err_mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
  }
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    stop_ = true;
  }
  q_cv_.notify_all();
  if (pusher_.joinable()) pusher_.join();
  {
    std::lock_guard<std::mutex> lock(lq_mu_);
    local_stop_ = true;
  }
  lq_cv_.notify_all();
  if (local_thread_.joinable()) local_thread_.join();
  FrameHeader bye{};
  bye.magic = kFrameMagic;
  bye.type = static_cast<uint8_t>(MsgType::kBye);
  bye.sender = opts_.rank;
  for (auto& per_server : conns_)
    for (auto& c : per_server) c->send(bye, nullptr, 0);
  if (local_reduce_)
    for (uint32_t r : local_->ranks())
      if (r != opts_.rank) local_->peer(r)->send(bye, nullptr, 0);
  // Give the byes a moment to leave before the sockets close.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (auto& per_server : conns_)
    for (auto& c : per_server)
      while (!c->closed() && std::chrono::steady_clock::now() < deadline && !c->idle())
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (loop_) loop_->stop();
  {
    std::lock_guard<std::mutex> lock(err_mu_);
    if (error_.empty()) error_ = "fastps was shut down";
  }
  std::vector<std::shared_ptr<Handle>> all;
  {
    std::lock_guard<std::mutex> lock(handles_mu_);
    for (auto& kv : handles_) all.push_back(kv.second);
  }
  for (auto& h : all) fail_handle(h, "fastps was shut down while this push_pull was running");
  conns_.clear();
  // Normally long gone; after a peer crashed before unlinking, the survivors do it.
  if (local_) local_->unlink_all();
}

}  // namespace fastps
