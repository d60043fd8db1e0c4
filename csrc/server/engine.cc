#include "server/engine.h"

#include <chrono>
#include <cstring>
#include <sstream>

#include "common/dtype.h"
#include "common/logging.h"
#include "common/thread_name.h"
#include "common/trace.h"
#include "kernels/sum.h"
#include "protocol/flags.h"
#include "transport/link.h"

namespace fastps {

static int64_t steady_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

SumEngine::SumEngine(int index, uint32_t num_workers, uint32_t server_id, const EngineRules& rules)
    : index_(index),
      num_workers_(num_workers),
      server_id_(server_id),
      quorum_(rules.quorum, rules.quorum_fraction, rules.quorum_history, num_workers),
      params_(num_workers, rules.staleness, server_id, rules.quorum, rules.quorum_fraction,
              rules.quorum_history),
      nudge_(rules.nudge),
      nudge_overdue_us_(rules.nudge_overdue_us),
      awaited_(num_workers),
      conn_of_rank_(num_workers),
      compressed_(num_workers, server_id, [this](const FrameHeader& h, const std::string& m) {
        if (broadcast_error_) broadcast_error_(h, m);
      }) {}

SumEngine::~SumEngine() { stop(); }

void SumEngine::start(bool threaded) {
  threaded_ = threaded;
  if (!threaded_) return;
  thread_ = std::thread([this] {
    name_this_thread("fastps-sum" + std::to_string(index_));
    run();
  });
}

void SumEngine::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(inline_mu_);
  inline_stopped_ = true;
  keys_.clear();
}

void SumEngine::post(PushWork&& w) {
  if (!threaded_) {
    if (inline_owner_.load() == std::this_thread::get_id()) {
      inline_pending_.push_back(std::move(w));
      return;
    }
    std::lock_guard<std::mutex> lock(inline_mu_);
    if (inline_stopped_) return;
    inline_owner_ = std::this_thread::get_id();
    handle(w);
    while (!inline_pending_.empty()) {
      PushWork next = std::move(inline_pending_.front());
      inline_pending_.pop_front();
      handle(next);
    }
    inline_owner_ = std::thread::id{};
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(w));
  }
  cv_.notify_one();
}

void SumEngine::run() {
  std::deque<PushWork> batch;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      batch.swap(queue_);
    }
    for (auto& w : batch) handle(w);
    batch.clear();
  }
}

static std::string describe(uint8_t dtype, uint64_t len, uint64_t tensor_bytes) {
  std::ostringstream os;
  os << len << " bytes of " << dtype_name(static_cast<DType>(dtype)) << " (whole tensor "
     << tensor_bytes << " bytes)";
  return os.str();
}

void SumEngine::fail(KeyState& st, const FrameHeader& h, const std::string& msg) {
  LOG_WARN("server " << server_id_ << ": " << msg);
  st.error = msg;
  st.acc = Payload{};
  st.shm.clear();
  st.reply_to.clear();
  if (broadcast_error_) broadcast_error_(h, msg);
}

void SumEngine::refuse(const PushWork& w, const std::string& msg) {
  LOG_WARN("server " << server_id_ << ": " << msg);
  FrameHeader e = answer_header(w.hdr, MsgType::kError, server_id_);
  auto text = std::make_shared<std::string>(msg);
  Link(w.conn, false).send(e, Payload::memory(text->data(), text->size(), text));
}

// The compression a pushed part names, for error messages.
static std::string compressed_spec_text(const Payload& p, uint64_t len) {
  try {
    return spec_of(read_compressed_header(p.data, len)).describe();
  } catch (const std::exception& e) {
    return std::string("an unreadable header (") + e.what() + ")";
  }
}

void SumEngine::handle(PushWork& w) {
  const FrameHeader& h = w.hdr;
  if (h.type != static_cast<uint8_t>(MsgType::kPush)) {  // an owner's answer to a rack sum
    relay_down(w);
    return;
  }
  if (h.flags & (kFlagAsync | kFlagAsyncInit)) {  // parameters kept here (param_store.h)
    std::string bad = params_.handle(w.conn, h, w.data);
    async_updates_ = params_.updates();
    late_outer_ = params_.late_outer();
    if (!bad.empty()) refuse(w, bad);
    return;
  }
  uint64_t key = part_key(h.tensor, h.part);
  if ((h.flags & kFlagCompressed) || compressed_.pending(key)) {
    auto plain = keys_.find(key);
    if ((h.flags & kFlagCompressed) && plain != keys_.end() && plain->second.count > 0 &&
        plain->second.error.empty()) {
      std::ostringstream os;
      os << "compression mismatch in part " << h.part << " of tensor id " << h.tensor << ": worker "
         << plain->second.first_rank << " pushed it uncompressed, worker " << h.sender
         << " compressed it with " << compressed_spec_text(w.data, h.len);
      fail(plain->second, h, os.str());
      return;
    }
    compressed_.handle(w.conn, h, w.data);
    return;
  }
  KeyState& st = keys_[key];
  bool quorum = h.flags & kFlagQuorum;
  if (quorum && st.error.empty() && h.round < st.round && quorum_.knows(key)) {
    answer_late(w);  // its round closed without it (quorum.h); or a catch-up fetch of it
    return;
  }
  if (quorum && (h.flags & kFlagNoData) && st.error.empty()) {
    // A catch-up fetch is answered from the history only: it must never count as a push.
    std::ostringstream os;
    os << "worker " << h.sender << " fetched round " << h.round << " of part " << h.part
       << " of tensor id " << h.tensor << ", which has not closed (the open round is " << st.round
       << ")";
    refuse(w, os.str());
    return;
  }
  if (!st.error.empty()) {
    // Already failed: tell this sender too, so it does not wait.
    FrameHeader e = answer_header(h, MsgType::kError, server_id_);
    auto msg = std::make_shared<std::string>(st.error);
    Link(w.conn, false).send(e, Payload::memory(msg->data(), msg->size(), msg));
    return;
  }
  uint32_t expected = h.pushers ? h.pushers : num_workers_;
  const bool relayed = h.flags & kFlagRelay;
  uint32_t owner = relayed ? relay_route(h).owner : kNotRelayed;
  uint64_t owner_pushers = relayed ? relay_route(h).owner_pushers : 0;
  if (st.count == 0) {
    st.owner = owner;
    st.owner_pushers = owner_pushers;
    st.expected = expected;
    st.dtype = h.dtype;
    st.len = h.len;
    st.tensor_bytes = h.tensor_bytes;
    st.first_rank = h.sender;
    st.reply_to.assign(num_workers_, nullptr);
    st.wants.assign(num_workers_, true);
    // The round comes from the tensor's history on the workers; a part that appears only
    // once a tensor grows starts at the tensor's round, so adopt it and only require the
    // other pushes of this round to agree with it.
    st.round = h.round;
  } else if (h.dtype != st.dtype || h.len != st.len || h.tensor_bytes != st.tensor_bytes ||
             h.round != st.round || expected != st.expected || owner != st.owner ||
             owner_pushers != st.owner_pushers) {
    std::ostringstream os;
    os << "mismatch in part " << h.part << " of tensor id " << h.tensor << ": worker "
       << st.first_rank << " pushed " << describe(st.dtype, st.len, st.tensor_bytes) << ", worker "
       << h.sender << " pushed " << describe(h.dtype, h.len, h.tensor_bytes);
    if (h.round != st.round) os << " (rounds " << st.round << " vs " << h.round << ")";
    if (expected != st.expected)
      os << " (they count " << st.expected << " vs " << expected << " pushing hosts)";
    if (owner != st.owner || owner_pushers != st.owner_pushers)
      os << " (rack routes differ: owner "
         << static_cast<int64_t>(st.owner == kNotRelayed ? -1 : st.owner) << " waiting for "
         << st.owner_pushers << " vs owner "
         << static_cast<int64_t>(owner == kNotRelayed ? -1 : owner) << " waiting for "
         << owner_pushers << "; -1: not relayed)";
    fail(st, h, os.str());
    return;
  }
  if (st.reply_to[h.sender]) {
    std::ostringstream os;
    os << "worker " << h.sender << " pushed part " << h.part << " of tensor id " << h.tensor
       << " twice in round " << h.round;
    fail(st, h, os.str());
    return;
  }
  st.reply_to[h.sender] = w.conn;
  st.wants[h.sender] = !(h.flags & kFlagNoReply);
  // Workers' own connections only: a rack relay pushes under a worker's rank, and a nudge
  // is a worker's frame (rack_relay.h).
  if (w.conn && !(w.conn->peer().conn_index & kRelayConnBit)) conn_of_rank_[h.sender] = w.conn;
  size_t count = h.len / dtype_size(static_cast<DType>(h.dtype));
  if (!(h.flags & kFlagNoData)) st.contributed++;
  if (h.flags & kFlagNoData) {
    // Asks for the result only: nothing to add.
  } else if (w.data.in_slot()) {
    st.shm.push_back(SlotPart{std::move(w.data), h.sender});
  } else if (!st.acc.keep) {     // pushed bytes always come with their buffer
    st.acc = std::move(w.data);  // the first pushed bytes become the sum: no copy
  } else {
    trace::mark(trace::Mark::kSumBegin, h.tensor, h.part, h.sender, h.len);
    sum_into(st.acc.data, w.data.data, count, static_cast<DType>(h.dtype));
    trace::mark(trace::Mark::kSumEnd, h.tensor, h.part, h.sender, h.len);
    w.data = Payload{};
  }
  if (quorum) quorum_.note_push(key, h.sender, h.round);
  ++st.count;
  if (nudge_ && !quorum && st.owner == kNotRelayed && st.expected == num_workers_ &&
      num_workers_ >= 3) {
    int64_t now = steady_us();
    nudge_overdue(h.sender, now);
    if (st.count + 1 == st.expected) {
      for (uint32_t i = 0; i < num_workers_; ++i)
        if (!st.reply_to[i]) send_nudge(i, h, st.round);
    } else if (st.count == (st.expected + 1) / 2) {
      // Half in: a pusher still missing it when it pushes something else here after
      // nudge_overdue_us skipped it (its order diverged) and is nudged then.
      for (uint32_t i = 0; i < num_workers_; ++i)
        if (!st.reply_to[i]) awaited_[i].push_back(Awaited{h, st.round, now});
    }
  }
  if (quorum ? !quorum_.may_close(key, st.round, st.count, st.expected) : st.count < st.expected)
    return;
  trace::mark(trace::Mark::kAllIn, h.tensor, h.part, h.sender, h.len);
  if (st.contributed == 0) {
    std::ostringstream os;
    os << "part " << h.part << " of tensor id " << h.tensor << ": all " << st.expected
       << " pushes of round " << st.round << " only asked for the result; none carried data";
    fail(st, h, os.str());
    return;
  }
  complete(st, h);
}

void SumEngine::send_nudge(uint32_t rank, const FrameHeader& h, uint64_t round) {
  auto conn = conn_of_rank_[rank].lock();  // unknown until that worker pushed something here
  if (!conn) return;
  FrameHeader n{};
  n.magic = kFrameMagic;
  n.type = static_cast<uint8_t>(MsgType::kNudge);
  n.dtype = h.dtype;
  n.sender = server_id_;
  n.part = h.part;
  n.tensor = h.tensor;
  n.tensor_bytes = h.tensor_bytes;
  n.round = round;
  // Ahead of the answers queued to that worker: it may be waiting behind them.
  if (conn->send_first(n)) nudges_++;
}

void SumEngine::nudge_overdue(uint32_t rank, int64_t now_us) {
  auto& q = awaited_[rank];
  while (!q.empty()) {
    const Awaited& a = q.front();
    auto it = keys_.find(part_key(a.hdr.tensor, a.hdr.part));
    bool still = it != keys_.end() && it->second.round == a.round && it->second.error.empty() &&
                 it->second.count < it->second.expected && !it->second.reply_to[rank];
    if (still) {
      if (now_us - a.since_us < nudge_overdue_us_) return;  // the rest are younger still
      // Not the part being pushed now: that one is in (reply_to) by the time this runs.
      send_nudge(rank, a.hdr, a.round);
    }
    q.pop_front();
  }
}

namespace {
// Keeps a shared-memory slot from being reused while replies still read it.
struct SlotHold {
  Payload slot;
  explicit SlotHold(Payload s) : slot(std::move(s)) { slot.ref(1); }
  ~SlotHold() { slot.unref(); }
};
}  // namespace

// With the timeline on, a callback that marks when the answer to `rank` left; else none,
// so the answer path allocates nothing more.
static std::function<void()> answer_written(const FrameHeader& r, uint32_t rank) {
  if (!trace::on()) return nullptr;
  return [tensor = r.tensor, part = r.part, rank, len = r.len] {
    trace::mark(trace::Mark::kAnswerWritten, tensor, part, rank, len);
  };
}

void SumEngine::complete(KeyState& st, const FrameHeader& h) {
  if (st.owner != kNotRelayed) {
    relay_up(st, h);
    return;
  }
  FrameHeader r = answer_header(h, MsgType::kResult, server_id_);
  r.pushers = 0;
  auto dt = static_cast<DType>(h.dtype);
  size_t count = h.len / dtype_size(dt);
  Payload result = std::move(st.acc);  // the sum as bytes, unless a slot takes it
  st.acc = Payload{};
  if (!st.shm.empty()) {
    // The sum is finished in the last shared-memory part, so the pusher that
    // owns it reads the result where it wrote its input (no copy back).
    const Payload& home = st.shm.back().slot;
    trace::mark(trace::Mark::kSumBegin, h.tensor, h.part, st.shm.back().sender, h.len);
    if (!result.empty()) sum_into(home.data, result.data, count, dt);
    for (size_t i = 0; i + 1 < st.shm.size(); ++i)
      sum_into(home.data, st.shm[i].slot.data, count, dt);
    if (h.flags & kFlagQuorum)
      quorum_.finish(part_key(h.tensor, h.part), st.round, home.data, h.len, dt, st.count,
                     st.expected);
    for (size_t i = 0; i + 1 < st.shm.size(); ++i)
      std::memcpy(st.shm[i].slot.data, home.data, h.len);
    trace::mark(trace::Mark::kSumEnd, h.tensor, h.part, st.shm.back().sender, h.len);
    // Socket replies read from the slot; it stays held until the last is written.
    auto hold = std::make_shared<SlotHold>(home);
    result = Payload::memory(home.data, h.len, hold);
  } else if (h.flags & kFlagQuorum) {
    quorum_.finish(part_key(h.tensor, h.part), st.round, result.data, h.len, dt, st.count,
                   st.expected);
  }
  std::vector<bool> in_slot(num_workers_, false);
  // A pusher whose part lay in a slot reads the sum in that same slot.
  for (auto& p : st.shm) {
    in_slot[p.sender] = true;
    Link(st.reply_to[p.sender], true).send(r, p.slot, answer_written(r, p.sender));
  }
  for (uint32_t i = 0; i < num_workers_; ++i) {
    if (!st.reply_to[i] || in_slot[i]) continue;
    // A pusher that wants no result (it forwarded its block) learns only that the
    // round is complete: a header with len 0.
    Link(st.reply_to[i], false).send(r, st.wants[i] ? result : Payload{}, answer_written(r, i));
  }
  st.shm.clear();
  st.count = 0;
  st.contributed = 0;
  st.round++;
  std::fill(st.reply_to.begin(), st.reply_to.end(), nullptr);
  parts_summed_++;
}

void SumEngine::relay_up(KeyState& st, const FrameHeader& h) {
  uint64_t key = part_key(h.tensor, h.part);
  std::ostringstream ctx;
  ctx << "rack server " << server_id_ << " could not relay part " << h.part << " of tensor id "
      << h.tensor << " to its owner, server " << st.owner << ": ";
  if (relays_.count(key)) {
    // Workers push a part's next round only after its answer: this would be a protocol bug.
    if (fatal_) fatal_(ctx.str() + "its previous round is still unanswered");
    return;
  }
  // The owner sees one push from this rack, made by the rack's relay rank: a plain sum,
  // without flags or route.
  FrameHeader up = h;
  clear_relay_route(&up);
  up.flags = 0;
  up.round = st.round;
  up.pushers = static_cast<uint32_t>(st.owner_pushers);
  Payload sum = std::move(st.acc);
  st.acc = Payload{};
  PendingRelay& pending = relays_[key];
  pending.owner = st.owner;
  pending.reply_to.swap(st.reply_to);
  st.reply_to.assign(num_workers_, nullptr);
  st.count = 0;
  st.contributed = 0;
  st.round++;
  parts_summed_++;
  std::string why;
  if (!relay_) why = "this server was given no rack route";
  // The relay stamps the sender (its rack's relay rank) once it has its route.
  if (!relay_ || !relay_->forward(pending.owner, up, sum, &why)) {
    relays_.erase(key);
    if (fatal_) fatal_(ctx.str() + why);
  }
}

void SumEngine::relay_down(PushWork& w) {
  const FrameHeader& h = w.hdr;
  uint64_t key = part_key(h.tensor, h.part);
  auto it = relays_.find(key);
  if (it == relays_.end()) {
    // An owner's error about a part this rack has not sent up yet: the owner told every
    // worker directly as well, so there is no one here to tell.
    if (h.type != static_cast<uint8_t>(MsgType::kError))
      LOG_WARN("server " << server_id_ << ": an answer from server " << h.sender << " for part "
                         << h.part << " of tensor id " << h.tensor
                         << " that this rack is not waiting for");
    return;
  }
  FrameHeader r = answer_header(h, static_cast<MsgType>(h.type), server_id_);
  r.pushers = 0;
  for (uint32_t i = 0; i < it->second.reply_to.size(); ++i) {
    auto& conn = it->second.reply_to[i];
    if (!conn) continue;
    Link(conn, false).send(r, w.data, answer_written(r, i));
  }
  relays_.erase(it);
  w.data = Payload{};
}

void SumEngine::answer_late(PushWork& w) {
  const FrameHeader& h = w.hdr;
  uint64_t key = part_key(h.tensor, h.part);
  std::string why;
  auto bytes = quorum_.result_of(key, h.round, &why);
  if (bytes && bytes->size() != h.len) {
    std::ostringstream os;
    os << "closed round " << h.round << " summed " << bytes->size() << " bytes, this push has "
       << h.len;
    why = os.str();
    bytes = nullptr;
  }
  if (!bytes) {
    std::ostringstream os;
    os << "worker " << h.sender << " pushed part " << h.part << " of tensor id " << h.tensor
       << " late: " << why;
    refuse(w, os.str());
    return;
  }
  // Dropped: the round's sum went out without it; the sender gets the same bytes, and in
  // pushers how many rounds closed after this one, so it can fetch them and catch up
  // (docs/guide/async.md, "Catch-up"). The open round is st.round: st.round - 1 closed last.
  KeyState& st = keys_[key];
  FrameHeader r = answer_header(h, MsgType::kResult, server_id_);
  r.pushers = static_cast<uint32_t>(st.round - 1 - h.round);
  if (w.data.in_slot()) {
    std::memcpy(w.data.data, bytes->data(), h.len);
    Link(w.conn, true).send(r, w.data, answer_written(r, h.sender));
  } else {
    Link(w.conn, false)
        .send(r, Payload::memory(bytes->data(), bytes->size(), bytes), answer_written(r, h.sender));
  }
  w.data = Payload{};
  if (h.flags & kFlagNoData)
    fetched_rounds_++;
  else
    late_pushes_++;
  quorum_.note_push(key, h.sender, h.round);
  // The laggard moved up: the open round may have been waiting for it to be in reach.
  if (st.count > 0 && st.error.empty() && quorum_.may_close(key, st.round, st.count, st.expected)) {
    FrameHeader open = h;
    open.round = st.round;
    complete(st, open);
  }
}

}  // namespace fastps
