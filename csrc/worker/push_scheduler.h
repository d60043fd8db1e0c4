// Decides which queued part a worker pushes next, and when. No sockets: it
// sees parts as tickets (urgency, server, bytes) and is told when bytes left
// the socket buffer and when a part was answered, so it can be tested alone.
//
// Parts wait in one queue per server ordered by urgency, the same total order
// on every worker: priority (higher first), then tensor id, then part index.
// Two limits per server keep the pushes in that order and the workers in step:
// - credit_bytes: bytes handed to the transport but not yet written to the
//   socket. Kernel buffers are first come first served; what does not fit
//   waits in the queue, where a late urgent part can still overtake it.
// - window_bytes: bytes of unanswered parts more urgent than the next one. A
//   part is answered only when every worker pushed it, so a worker whose flow
//   to a server runs ahead (TCP shares a link unevenly) waits for the others
//   and its link carries parts for its other servers meanwhile. Counting only
//   more urgent parts keeps this free of deadlock although workers can start
//   in different orders: take the most urgent part that is pushed somewhere
//   and not answered; every worker that has not pushed it has it, or something
//   more urgent, at the head of its queue, and nothing unanswered ahead of
//   that, so it may push it.
// A server may nudge a worker (boost): every other pusher's copy of a part is in, or half
// of them have waited a while and this worker pushed other parts instead (server/engine.h). The
// part then goes before every other part for that server and outside the window (not the credit): a
// worker whose order diverged (a more urgent gradient arrived just before or just after its link
// was free) would otherwise leave the part for the end of the round while the server's answers for
// it wait. Deadlock freedom holds: a boosted part only needs credit, which frees as bytes are
// written. Only a part that has waited in the queue at least boost_min_wait is boosted
// (FASTPS_NUDGE_MIN_WAIT, default 0): one queued just now is late because this worker is (its
// backward pass ran behind), not because its order diverged.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

namespace fastps {

// What the scheduler knows of a part.
struct PushTicket {
  int priority = 0;
  uint64_t tensor = 0;  // tensor id
  uint32_t part = 0;    // part index within the tensor
  uint32_t server = 0;
  size_t len = 0;         // bytes
  int64_t tag = 0;        // the caller's, passed back untouched (the worker: handle id)
  int64_t queued_us = 0;  // when the caller queued it, on the caller's clock (boost)
  // Cheap to send (no compression on the way out): the thread that frees credit or
  // window may push it itself (take_admissible's light_only).
  bool light = true;
};

// The worker's clock for PushTicket::queued_us.
inline int64_t steady_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Smaller is more urgent. Strict on everything queued at once, because only
// one push_pull per tensor runs at a time.
using UrgencyKey = std::tuple<int64_t, uint64_t, uint32_t>;
inline UrgencyKey urgency(const PushTicket& t) {
  return UrgencyKey{-static_cast<int64_t>(t.priority), t.tensor, t.part};
}

class PushScheduler {
 public:
  // server_weights: each server's share of the bytes (one per server, > 0 in
  // total); a server's window is window_bytes scaled by its share times the
  // number of servers, so an even split gives every server window_bytes.
  // window_bytes 0: no window limit. boost_min_wait_us: how long a part must have been
  // queued before boost takes it (0: at once).
  PushScheduler(size_t credit_bytes, size_t window_bytes, const std::vector<double>& server_weights,
                int64_t boost_min_wait_us = 0);

  size_t num_servers() const { return window_.size(); }
  size_t window(size_t server) const { return window_.at(server); }

  // Queues parts; throws std::out_of_range for a server that does not exist. wake: wake
  // the push thread (false: the caller takes what is admissible itself, take_admissible
  // with light_only, which wakes it for a part that is not light).
  void enqueue(const std::vector<PushTicket>& parts, bool wake = true);
  // Takes every part that is admissible now, most urgent first across the
  // servers, charging each to its server's credit and window. keep (if set)
  // runs under the scheduler's lock for each part taken: false drops the part
  // unsent and uncharged (it failed while queued). Returns how many were added.
  // light_only: stops at the first admissible part that is not light and wakes the
  // thread blocked in wait_admissible to take it (the caller is not the push thread).
  size_t take_admissible(std::vector<PushTicket>* out,
                         const std::function<bool(const PushTicket&)>& keep = nullptr,
                         bool light_only = false);
  // Blocks until take_admissible finds something (then fills out and returns
  // true) or stop() is called (returns false). Clears out first.
  bool wait_admissible(std::vector<PushTicket>* out,
                       const std::function<bool(const PushTicket&)>& keep = nullptr);
  // A taken part's bytes left the socket buffer: they no longer use credit. Returns
  // whether the server now admits its head and the push thread should take it; wake:
  // wake that thread (else the caller takes the part itself, take_admissible).
  bool written(uint32_t server, size_t len, bool wake = true);
  // A taken part was answered (or failed): it leaves its server's window. Returns and
  // wakes as written().
  bool answered(const PushTicket& t, bool wake = true);
  // The part t (as the worker queued it) is the last one its server waits for: pushes it
  // next. False (and nothing changes) when it is not queued (already taken, or not yet),
  // or was queued less than boost_min_wait_us before now_us (the caller's clock).
  bool boost(const PushTicket& t, int64_t now_us = 0);
  void stop();

  // Introspection for tests and diagnostics.
  size_t queued(size_t server) const;
  size_t unwritten_bytes(size_t server) const;
  size_t unanswered_bytes(size_t server) const;
  // Bytes still to be written to the transport: queued parts plus taken ones not yet
  // written, over every server (the worker's pacing burst rule).
  size_t backlog_bytes() const;
  uint64_t boosts() const;

 private:
  // Urgency, then the caller's tag: a failed push_pull's parts (dropped by keep when
  // taken) may still be queued when the tensor's next push_pull queues the same parts.
  struct MoreUrgent {
    bool operator()(const PushTicket& a, const PushTicket& b) const {
      auto ua = urgency(a), ub = urgency(b);
      return ua < ub || (ua == ub && a.tag < b.tag);
    }
  };
  using Queue = std::set<PushTicket, MoreUrgent>;
  // Server s's next part (boosted ones first), or null; *boosted says which (mu_ held).
  const PushTicket* head_locked(size_t s, bool* boosted) const;
  // Whether server s admits the head of its queue now (mu_ held).
  bool admits_locked(size_t s) const;

  size_t credit_bytes_;
  size_t window_bytes_;
  int64_t boost_min_wait_us_;
  std::vector<size_t> window_;  // per server, scaled by its share of the bytes

  // Lock order: mu_ is taken before anything keep() locks (the worker's part
  // table); nothing is locked while calling into the scheduler's methods.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Queue> queues_;
  std::vector<Queue> boosted_;  // queued parts a server is waiting for from this worker only
  uint64_t boosts_ = 0;
  std::vector<size_t> unwritten_;  // bytes taken, not yet written to the socket
  size_t queued_bytes_ = 0;        // bytes of the parts in queues_
  // Parts taken and not yet answered, per server: urgency -> bytes.
  std::vector<std::map<UrgencyKey, size_t>> unanswered_;
  bool stop_ = false;
};

}  // namespace fastps
