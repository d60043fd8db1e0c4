#include "worker/worker.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "common/logging.h"
#include "common/thread_name.h"
#include "common/trace.h"
#include "kernels/sum.h"
#include "protocol/flags.h"
#include "protocol/frame_check.h"
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
    : opts_(std::move(opts)),
      // The options are checked before the first member that uses them is built.
      partitioner_((check_options(opts_), opts_.partition_bytes), weights_or_equal(opts_)),
      scheduler_(opts_.credit_bytes, opts_.window_bytes, weights_or_equal(opts_),
                 opts_.nudge_min_wait_us),
      handles_(&registry_),
      failures_(opts_.rank, &parts_, &handles_, &scheduler_) {
  if (opts_.num_workers > 1 && opts_.servers.empty())
    throw std::invalid_argument("a job with more than one worker needs at least one server");
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
  // With shared memory on, every host pushes each part once: its local sum, or
  // the part itself where a worker is alone on its host. Counting hosts only
  // where this host reduces locally would make a lone worker count workers
  // while its peers on bigger hosts count hosts, and the server refuse both.
  pushers_ = opts_.shm && opts_.num_hosts ? opts_.num_hosts : opts_.num_workers;
  if (opts_.shm && !opts_.servers.empty() && (local_reduce_ || any_local_server)) {
    LocalGroupOptions lo;
    lo.job_id = opts_.job_id;
    lo.token = opts_.token;
    lo.rank = opts_.rank;
    lo.num_workers = opts_.num_workers;
    lo.local_ranks = local_reduce_ ? opts_.local_ranks : std::vector<uint32_t>{opts_.rank};
    lo.shm_bytes = opts_.shm_bytes;
    lo.timeout_s = opts_.connect_timeout_s;
    lo.cancelled = [this] { return error(); };
    local_ = std::make_unique<LocalGroup>(lo);
    LocalReducer::Context ctx;
    ctx.rank = opts_.rank;
    ctx.num_hosts = opts_.num_hosts;
    ctx.reduce = local_reduce_;
    ctx.group = local_.get();
    ctx.pool = pool_.get();
    ctx.parts = &parts_;
    ctx.push = [this](const std::vector<PushTicket>& t) { enqueue_parts(t); };
    ctx.handles = &handles_;
    ctx.failures = &failures_;
    ctx.stats = &stats_;
    reducer_ = std::make_unique<LocalReducer>(ctx);
    failures_.set_reducer(reducer_.get());
  }
  PathContext pc;
  pc.opts = &opts_;
  pc.pushers = pushers_;
  pc.local_reduce = local_reduce_;
  pc.links = &links_;
  pc.scheduler = &scheduler_;
  pc.parts = &parts_;
  pc.handles = &handles_;
  pc.registry = &registry_;
  pc.local = local_.get();
  pc.reducer = reducer_.get();
  pc.error_feedback = &error_feedback_;
  pc.stats = &stats_;
  pc.abort = [this](const std::string& reason) { abort(reason); };
  pc.written = [this](uint32_t server, size_t len) { on_written(server, len); };
  paths_ = std::make_unique<PartPaths>(pc);
}

Worker::~Worker() { shutdown(); }

void Worker::start() {
  if (!error().empty()) throw AbortError(error());  // aborted before it started
  loop_ = std::make_unique<EventLoop>("worker-io");
  links_.resize(opts_.servers.size());
  pacing_burst_ = opts_.pacing_burst_bytes > 0 && opts_.pacing_burst_bytes_per_s > 0;
  // The segment exists before anyone can ask to map it.
  if (local_) local_->open();
  // The servers' connections, then the local peers': this worker's loop carries them all.
  std::vector<std::shared_ptr<TcpConnection>> conns;
  for (size_t s = 0; s < opts_.servers.size(); ++s) {
    for (int k = 0; k < opts_.conns_per_server; ++k) {
      std::string desc = "server " + std::to_string(s) + " at " + opts_.servers[s];
      int fd = connect_authenticated(opts_.servers[s], opts_.job_id, opts_.token, opts_.rank,
                                     static_cast<uint32_t>(k), opts_.connect_timeout_s,
                                     static_cast<int>(opts_.notsent_lowat), desc,
                                     [this] { return error(); });
      // With the burst rule the caps wait for the first large backlog (pace_for_backlog):
      // once a socket is paced, Linux keeps pacing it, also below any cap we set.
      if (s < opts_.pacing_bytes_per_s.size() && opts_.pacing_bytes_per_s[s] > 0 && !pacing_burst_)
        set_pacing_rate(fd, opts_.pacing_bytes_per_s[s] / opts_.conns_per_server);
      Peer p;
      p.rank = static_cast<uint32_t>(s);
      p.conn_index = static_cast<uint32_t>(k);
      auto conn = std::make_shared<TcpConnection>(fd, p, desc, this);
      conns.push_back(conn);
      links_[s].emplace_back(std::move(conn), false);
    }
  }
  if (local_reduce_)
    for (auto& c : local_->connect_peers(this)) conns.push_back(std::move(c));
  for (auto& c : conns) {
    c->count_bytes(&stats_.socket_bytes_sent, &stats_.socket_bytes_received);
    loop_->add(c);
  }
  loop_->start();
  if (local_) {
    attach_local_servers();
    // Every local peer and colocated server has mapped the segment: drop its
    // name now, so a crash from here on leaves nothing in /dev/shm.
    local_->unlink_own();
    reducer_->start();
  }
  pusher_ = std::thread([this] {
    name_this_thread("fastps-push");
    push_loop();
  });
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
    h.shm_offset = local_->segment_nonce();  // the server checks it mapped this run's segment
    // Header only: the slot fields carry the attach (protocol/messages.h), not a slot.
    if (links_[s][0].connection()->send(h, nullptr, 0)) ++asked;
  }
  std::unique_lock<std::mutex> lock(attach_mu_);
  bool ok = attach_cv_.wait_for(lock, std::chrono::duration<double>(opts_.connect_timeout_s),
                                [&] { return attach_replies_ >= asked || !error().empty(); });
  failures_.throw_if_failed();
  if (!ok)
    throw TimeoutError("worker " + std::to_string(opts_.rank) +
                       ": colocated servers did not answer the shared-memory attach within " +
                       std::to_string(opts_.connect_timeout_s) + " s");
}

void Worker::on_attached(Connection* c, const std::string& why_not) {
  if (!why_not.empty()) {
    LOG_WARN("worker " << opts_.rank << ": " << c->desc()
                       << " cannot map this worker's shared memory (" << why_not
                       << "); its parts go over TCP");
  } else {
    for (auto& l : links_[c->peer().rank]) l.set_peer_maps_slots(true);
  }
  {
    std::lock_guard<std::mutex> lock(attach_mu_);
    attach_replies_++;
  }
  attach_cv_.notify_all();
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
  failures_.throw_if_failed();
  for (auto& r : reqs) {
    size_t elem = dtype_size(r.dtype);
    if (r.nbytes % elem != 0)
      throw std::invalid_argument("tensor '" + r.name + "': " + std::to_string(r.nbytes) +
                                  " bytes is not a whole number of " + dtype_name(r.dtype) +
                                  " elements");
    fuser_.check(tensor_id_of(r.name), r.name, r.nbytes, r.dtype);  // before anything starts
    paths_->of(r).check(r);
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
    h->send = r.send;
    h->receive = r.receive;
    h->pushers = r.pushers;
    h->mode = r.mode;
    h->compression = r.compression;
    h->path = &paths_->of(*h);
    ids.push_back(handles_.add(h));
    hs.push_back(std::move(h));
  }
  start_handles(std::move(hs));
  return ids;
}

void Worker::start_handles(std::vector<std::shared_ptr<Handle>> hs) {
  // Handles with parts to move; the others finish here or wait in a fusion bucket.
  std::vector<std::shared_ptr<Handle>> moving;
  std::vector<std::shared_ptr<FusionBucket>> full;
  moving.reserve(hs.size());
  for (auto& h : hs) {
    size_t elem = dtype_size(h->dtype);
    if (opts_.servers.empty()) {
      // Single worker, no servers: the sum is the input itself.
      if (h->out != h->in && h->nbytes) std::memmove(h->out, h->in, h->nbytes);
      if (h->scale != 1.0) fastps::scale(h->out, h->nbytes / elem, h->dtype, h->scale);
      handles_.complete(h);
      continue;
    }
    std::shared_ptr<FusionBucket> bucket;
    std::string why;
    // A routed push_pull keeps its own parts: a bucket is a plain sum over every worker.
    if (!h->path->direct() && fuser_.arrive(h, &bucket, &why)) {
      if (!why.empty()) handles_.fail(h, why, ErrorKind::kError);
      if (bucket) full.push_back(std::move(bucket));
      continue;
    }
    moving.push_back(h);
  }
  for (auto& b : bucket_handles(full)) moving.push_back(std::move(b));
  std::vector<std::shared_ptr<Handle>> queued;
  queued.reserve(moving.size());
  for (auto& h : moving) {
    h->parts = partitioner_.split(h->tensor->id, h->nbytes, dtype_size(h->dtype));
    h->remaining = static_cast<uint32_t>(h->parts.size());
    if (h->parts.empty()) {
      handles_.complete(h);
      continue;
    }
    std::function<bool(uint32_t)> owned;
    if (local_reduce_ && !h->path->direct())
      owned = [this, id = h->tensor->id](uint32_t part) {
        return local_->owner(id, part) == opts_.rank;
      };
    std::string failed = parts_.add(h, owned);
    if (!failed.empty()) {
      handles_.fail(h, failed, ErrorKind::kAbort);  // an earlier disagreement about it
      continue;
    }
    queued.push_back(h);
  }
  if (trace::on())
    for (auto& h : queued)
      for (auto& p : h->parts) trace::mark(trace::Mark::kEnqueue, h->tensor->id, p.index, 0, p.len);
  std::vector<PushTicket> tickets;
  const int64_t now = steady_us();
  for (auto& h : queued) {
    // Routed parts go to the servers as they are: a local sum has nothing to add to a
    // forwarded block, and the server counts each worker's push.
    if (local_reduce_ && !h->path->direct()) {
      reducer_->start_parts(h);
      continue;
    }
    for (auto& p : h->parts) {
      PartTask t;
      t.handle = h;
      t.span = p;
      tickets.push_back(t.ticket());
      tickets.back().queued_us = now;
    }
  }
  if (!tickets.empty()) enqueue_parts(tickets);
}

// Up to this many bytes per call the caller pushes, when nothing else waits to be pushed:
// a small tensor's round trip then has no push-thread wake-up on it (issue 41's loopback
// latency). With a backlog the caller leaves it to the push thread and the network thread,
// whose wake-ups are not on the round trip then: in a backward pass every gradient's sends
// would delay the next layer (measured once without this rule: ResNet-50 at compute 1,
// k = 2, 0.9% slower).
static constexpr size_t kCallerPushBytes = 256 << 10;

void Worker::enqueue_parts(const std::vector<PushTicket>& tickets) {
  size_t bytes = 0;
  for (auto& t : tickets) bytes += t.len;
  bool here = opts_.push_from_io && bytes <= kCallerPushBytes && scheduler_.backlog_bytes() == 0;
  scheduler_.enqueue(tickets, !here);
  // What is not admissible now is admitted by a write or an answer, which push it
  // (on_written, on_result); a part that is not light wakes the push thread.
  if (here) send_admissible();
}

std::vector<std::shared_ptr<Handle>> Worker::bucket_handles(
    const std::vector<std::shared_ptr<FusionBucket>>& buckets) {
  std::vector<std::shared_ptr<Handle>> out;
  for (auto& b : buckets) {
    auto h = std::make_shared<Handle>();
    try {
      h->tensor = registry_.begin(b->plan.name);
    } catch (const std::exception& e) {
      // Only a name clash with a user's tensor can get here: fail the members, not the job.
      for (auto& m : fuser_.end_round(b.get()))
        if (m) handles_.fail(m, "tensor '" + m->tensor->name + "': " + e.what(), ErrorKind::kError);
      continue;
    }
    h->in = b->data.get();
    h->out = b->data.get();
    h->nbytes = b->plan.nbytes;
    h->dtype = b->plan.dtype;
    h->priority = b->plan.priority;
    h->mode = b->mode;  // a round of catch-up fetches fetches the bucket's round
    h->path = &paths_->of(*h);
    int64_t id = handles_.add(h);
    // Holds the bucket, not the handle (no cycle); runs once the bucket's sum is in.
    std::weak_ptr<Handle> self = h;
    h->on_end = [this, b, id, self](const std::string& err, ErrorKind kind) {
      const BucketPlan& plan = b->plan;
      auto me = self.lock();
      uint64_t lag = me ? me->rounds_behind() : 0;  // the bucket's lag is each member's

      auto members = fuser_.end_round(b.get());
      for (size_t i = 0; i < members.size(); ++i) {
        auto& m = members[i];
        if (!m) continue;  // zero-filled by a plan change
        if (!err.empty()) {
          handles_.fail(m,
                        "tensor '" + m->tensor->name + "' (fused with " +
                            std::to_string(plan.members.size() - 1) + " other tensors as '" +
                            plan.name + "'): " + err,
                        kind);
          continue;
        }
        if (m->nbytes) std::memcpy(m->out, b->data.get() + plan.offsets[i], m->nbytes);
        m->note_lag(lag);
        if (m->scale != 1.0)
          fastps::scale(m->out, m->nbytes / dtype_size(m->dtype), m->dtype, m->scale);
        handles_.complete(m);
      }
      handles_.release(id);
    };
    out.push_back(std::move(h));
  }
  return out;
}

size_t Worker::set_fusion_plan(const std::string& plan, const std::vector<FusionMember>& members) {
  failures_.throw_if_failed();
  if (opts_.fusion_threshold == 0 || opts_.servers.empty()) return 0;
  size_t capacity = std::min(opts_.fusion_threshold, opts_.partition_bytes);
  auto buckets = plan_fusion(plan, members, capacity);
  size_t n = buckets.size();
  auto flush = fuser_.set_plan(plan, std::move(buckets));
  if (!flush.empty()) start_handles(bucket_handles(flush));
  return n;
}

std::function<bool(const PushTicket&)> Worker::marker(std::vector<PartTask>* tasks) {
  // Runs under the scheduler's lock: marks the part as pushed in the part table, or drops
  // it if it failed while it waited in the queue.
  return [this, tasks](const PushTicket& k) {
    PartTask t;
    if (!parts_.mark_in_flight(k, &t)) return false;
    tasks->push_back(std::move(t));
    return true;
  };
}

void Worker::push_loop() {
  std::vector<PushTicket> batch;
  std::vector<PartTask> tasks;
  auto keep = marker(&tasks);
  while (true) {
    tasks.clear();
    if (!scheduler_.wait_admissible(&batch, keep)) return;
    pace_for_backlog();
    for (auto& t : tasks) t.handle->path->send(t);
  }
}

bool Worker::pushes_here() const { return opts_.push_from_io && loop_ && loop_->on_loop_thread(); }

void Worker::on_written(uint32_t server, size_t len) {
  bool here = pushes_here();
  if (scheduler_.written(server, len, !here) && here) pump();
}

// The network thread learns first that a server admits more (its bytes left, or its answer
// came): pushing from here saves the push thread's wake-up, two context switches and a
// futex call per one or two parts (issue 41; docs/results/ab-2026-11-30-pushio/).
// Sends are non-blocking, so the loop is not held up; a compressed part's encoding would
// be, so the push thread keeps those.
void Worker::pump() {
  if (pumping_) {  // a send below finished at once and called on_written
    pump_again_ = true;
    return;
  }
  pumping_ = true;
  do {
    pump_again_ = false;
    if (!send_admissible()) break;
  } while (pump_again_);
  pumping_ = false;
}

bool Worker::send_admissible() {
  std::vector<PushTicket> batch;
  std::vector<PartTask> tasks;
  scheduler_.take_admissible(&batch, marker(&tasks), true);
  if (tasks.empty()) return false;
  pace_for_backlog();
  for (auto& t : tasks) t.handle->path->send(t);
  return true;
}

// The pacing caps (options.h) assume every flow of this host sends at once. While this
// worker has less than pacing_burst_bytes left to push, its pushes are one short burst that
// the servers answer after it, so the caps would leave half the link idle: the paced
// connections then run at the host's link rate. They start unpaced and get their caps with
// the first large backlog: a socket Linux paces stays paced (at the lower of our rate and
// its own estimate from the congestion window and the RTT), which slowed short compressed
// rounds on the rack. Only a change of state costs a setsockopt per connection.
void Worker::pace_for_backlog() {
  if (opts_.pacing_burst_bytes == 0 || !(opts_.pacing_burst_bytes_per_s > 0)) return;
  std::lock_guard<std::mutex> lock(pacing_mu_);
  bool burst = scheduler_.backlog_bytes() < opts_.pacing_burst_bytes;
  if (burst == pacing_burst_) return;
  pacing_burst_ = burst;
  for (size_t s = 0; s < links_.size() && s < opts_.pacing_bytes_per_s.size(); ++s) {
    double cap = opts_.pacing_bytes_per_s[s];
    if (!(cap > 0)) continue;  // unpaced (this host's server, or pacing off)
    double rate = burst ? std::max(cap, opts_.pacing_burst_bytes_per_s) : cap;
    for (auto& l : links_[s]) l.connection()->set_pacing(rate / opts_.conns_per_server);
  }
  ++stats_.pacing_switches;
}

void* Worker::on_header(Connection* c, const FrameHeader& h, std::string* why) {
  if (!check_frame_header(h, why)) {  // every field, before anything uses one
    *why = "malformed frame (" + *why + ")";
    return nullptr;
  }
  auto type = static_cast<MsgType>(h.type);
  bool from_peer = local_reduce_ && local_->is_peer(c);
  if (from_peer != (type == MsgType::kLocalPush || type == MsgType::kLocalResult ||
                    type == MsgType::kLocalError)) {
    *why = "unexpected frame type " + std::to_string(h.type) + " from " + c->desc();
    return nullptr;
  }
  if (from_peer) return reducer_->on_peer_header(c, h, why);
  if (type == MsgType::kNudge) return nullptr;  // len 0 (frame_check): on_frame acts on it
  if (type == MsgType::kError || type == MsgType::kFatal || type == MsgType::kShmAttached) {
    auto text = std::make_shared<std::string>(h.len, '\0');
    void* dst = text->data();
    c->rx_hold = std::move(text);
    return dst;
  }
  if (type != MsgType::kResult) {
    *why = "unexpected frame type " + std::to_string(h.type) + " from " + c->desc();
    return nullptr;
  }
  return on_result_header(c, h, why);
}

void* Worker::on_result_header(Connection* c, const FrameHeader& h, std::string* why) {
  trace::mark(trace::Mark::kResultHeader, h.tensor, h.part, h.sender, h.len);
  if (refers_to_slot(h)) return nullptr;  // a slot reference: nothing follows
  PartTask t;
  bool known = parts_.get(part_key(h.tensor, h.part), &t);
  // A part this worker pushed: its path says where the answer goes.
  if (known && t.owned) return t.handle->path->receive(c, h, why);
  if (h.flags & kFlagCompressed) {
    *why = std::string("compressed result for a part ") +
           (known ? "pushed uncompressed" : "this worker is not waiting for") + ", from " +
           c->desc();
    return nullptr;
  }
  return receive_in_place(parts_, c, h, why);
}

void Worker::on_frame(Connection* c, const FrameHeader& h, void* payload) {
  auto type = static_cast<MsgType>(h.type);
  if (local_reduce_ && local_->is_peer(c)) {
    reducer_->on_peer_frame(c, h, payload);
    return;
  }
  if (type == MsgType::kFatal) {
    auto text = std::static_pointer_cast<std::string>(std::move(c->rx_hold));
    abort(*text);
    return;
  }
  if (type == MsgType::kNudge) {
    // The other workers' copies of this part wait at the server for ours: push it next, unless it
    // is already on its way (or not submitted yet, or the local peer pushes it). A nudge that
    // crossed this worker's push meets the tensor's next round, if queued: that part only
    // goes a little early.
    PartTask t;
    if (parts_.get(part_key(h.tensor, h.part), &t) && t.owned && !t.in_flight &&
        scheduler_.boost(t.ticket(), steady_us()))
      stats_.nudged++;
    return;
  }
  if (type == MsgType::kShmAttached) {
    auto text = std::static_pointer_cast<std::string>(std::move(c->rx_hold));
    on_attached(c, *text);
    return;
  }
  if (type == MsgType::kError) {
    auto text = std::static_pointer_cast<std::string>(std::move(c->rx_hold));
    failures_.fail_tensor(h.tensor, "tensor '" + registry_.name_of(h.tensor) + "': " + *text,
                          false);
    return;
  }
  on_result(c, h, payload);
}

void Worker::on_result(Connection* c, const FrameHeader& h, void* payload) {
  PartTask t;
  if (!parts_.take(part_key(h.tensor, h.part), &t)) return;
  trace::mark(trace::Mark::kResult, h.tensor, h.part, h.sender, h.len);
  if (t.in_flight) {
    bool here = pushes_here();
    if (scheduler_.answered(t.ticket(), !here) && here) pump();
  }
  if (refers_to_slot(h) && !refers_to(h, t.stage)) {
    abort(c->desc() + " answered part " + std::to_string(h.part) + " of tensor '" +
          registry_.name_of(h.tensor) + "' in the wrong shared-memory slot");
    return;
  }
  t.handle->path->take_result(c, h, t, payload);
}

void Worker::on_close(Connection* c, bool clean, const std::string& reason) {
  if (failures_.shutting_down()) return;
  if (local_reduce_ && local_->is_peer(c)) {
    uint32_t peer = c->peer().rank;
    if (clean && !reducer_->waits_on_peer(peer)) return;  // it finished its work and left
    abort("lost connection to local worker " + std::to_string(peer) +
          (clean ? " (same host; it shut down while parts still needed it)"
                 : " (same host; it exited or was killed)") +
          ": " + reason);
    return;
  }
  abort("lost connection to " + c->desc() + ": " + reason);
}

void Worker::abort(const std::string& reason, ErrorKind kind, bool quiet) {
  failures_.abort(reason, kind, quiet);
  {
    // start() may be waiting for colocated servers; taking the lock first means it is
    // either before its predicate check or already asleep, so the wakeup is not lost.
    std::lock_guard<std::mutex> lock(attach_mu_);
  }
  attach_cv_.notify_all();
}

std::string Worker::error() const { return failures_.error(); }

bool Worker::poll(int64_t id) {
  auto h = handles_.get(id);
  std::lock_guard<std::mutex> lock(h->mu);
  return h->done;
}

uint64_t Worker::wait(int64_t id, double timeout_s) {
  auto h = handles_.get(id);
  std::unique_lock<std::mutex> lock(h->mu);
  bool ok = h->cv.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return h->done; });
  if (!ok) {
    lock.unlock();
    std::ostringstream os;
    os << "push_pull of tensor '" << h->tensor->name << "' on worker " << opts_.rank
       << " did not complete within " << timeout_s << " s (" << h->remaining.load() << " of "
       << h->parts.size() << " parts outstanding)" << fuser_.describe_wait(h->tensor->id)
       << "; another worker may not have submitted this tensor";
    abort(os.str(), ErrorKind::kTimeout);
    stop_stages(true);
    release(id);
    throw TimeoutError(os.str());
  }
  std::string err = h->error;
  ErrorKind kind = h->error_kind;
  lock.unlock();
  // A job-ending failure reaches the caller only once no stage can still read or write its
  // tensors (a part being copied by the local stage when the abort came, say).
  if (!err.empty() && !error().empty()) stop_stages(true);
  uint64_t behind = h->rounds_behind();
  release(id);
  if (!err.empty()) throw_error(kind, err);
  return behind;
}

void Worker::stop_stages(bool with_loop) {
  std::lock_guard<std::mutex> lock(stages_mu_);
  if (!stages_stopped_) {
    scheduler_.stop();
    if (pusher_.joinable()) pusher_.join();
    if (reducer_) reducer_->stop();
    stages_stopped_ = true;
  }
  if (with_loop && !loop_stopped_) {
    if (loop_) loop_->stop();
    loop_stopped_ = true;
  }
}

void Worker::release(int64_t id) { handles_.release(id); }

void Worker::shutdown() {
  if (!failures_.begin_shutdown()) return;
  stop_stages(false);
  FrameHeader bye{};
  bye.magic = kFrameMagic;
  bye.type = static_cast<uint8_t>(MsgType::kBye);
  bye.sender = opts_.rank;
  for (auto& per_server : links_)
    for (auto& l : per_server) l.send(bye);
  if (local_reduce_)
    for (uint32_t r : local_->ranks())
      if (r != opts_.rank && local_->connected(r)) local_->peer(r).send(bye);
  // Give the byes a moment to leave before the sockets close.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (auto& per_server : links_)
    for (auto& l : per_server)
      while (!l.connection()->closed() && std::chrono::steady_clock::now() < deadline &&
             !l.connection()->idle())
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // Half-close and wait for each server to close its side: closing with answers still
  // unread (a quorum round's late answers to a straggler) would reset the connection,
  // drop the bye still in the kernel's send buffer, and the server would see a crash.
  for (auto& per_server : links_)
    for (auto& l : per_server)
      if (!l.connection()->closed()) l.connection()->shutdown_send();
  for (auto& per_server : links_)
    for (auto& l : per_server)
      while (!l.connection()->closed() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
  stop_stages(true);
  failures_.fail_for_shutdown("fastps was shut down while this push_pull was running");
  links_.clear();
  // Normally long gone; after a peer crashed before unlinking, the survivors do it.
  if (local_) local_->unlink_all();
}

}  // namespace fastps
