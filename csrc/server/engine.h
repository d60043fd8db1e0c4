// One summation engine: a thread that owns a subset of part keys outright, so
// summing a part needs no lock. Pushes reach it through a queue; when every
// worker has pushed a part, the engine answers each push with the sum.
// Routed parts (kFlagNoData / kFlagNoReply) make the same round a forward: the
// sum runs over the pushes that carry data (one, to forward a block), and only
// the pushers that asked for it get the result; the others get an empty answer.
// Relayed parts (kFlagRelay, rack-level hierarchy): the rack's sum goes up to the part's
// owner through the RackRelay instead of back to the pushers, who get the owner's answer.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/buffer_pool.h"
#include "protocol/messages.h"
#include "server/compressed_sum.h"
#include "server/param_store.h"
#include "server/quorum.h"
#include "server/rack_relay.h"
#include "transport/connection.h"
#include "transport/payload.h"

namespace fastps {

// Beyond lock-step (docs/guide/async.md): quorum rounds and the async parameter store.
struct EngineRules {
  uint32_t quorum = 0;          // FASTPS_ROUND_QUORUM as a count (0: unset)
  double quorum_fraction = 0;   // ... or as a fraction of the pushers (0: unset)
  uint32_t quorum_history = 8;  // closed rounds kept for late pushers
  int64_t staleness = -1;       // async: SSP bound (< 0: unbounded)
  // Nudge the last pusher of a part when every other pusher's copy is in (MsgType::kNudge;
  // push_scheduler.h says why), and each missing pusher of a part whose half the copies have
  // been in for nudge_overdue_us when that pusher pushes another part here (it skipped
  // this one; one just behind in the same order pushes it sooner). Only where every
  // worker pushes (no local reduce, no relay), with at least 3 pushers (with 2, the first
  // copy would nudge the other at once).
  bool nudge = true;
  int64_t nudge_overdue_us = 50000;
};

struct PushWork {
  std::shared_ptr<Connection> conn;
  FrameHeader hdr;
  Payload data;  // the part: received bytes, or a slot in a colocated worker's segment
};

class SumEngine {
 public:
  SumEngine(int index, uint32_t num_workers, uint32_t server_id,
            const EngineRules& rules = EngineRules{});
  ~SumEngine();
  // threaded: a thread of its own sums what post() queues. Otherwise post() sums on
  // the caller's thread (the connection's loop): on a host with few cores a part of a
  // few hundred KiB sums in less time than handing it to another thread takes.
  void start(bool threaded = true);
  void stop();
  void post(PushWork&& w);
  // Called for frames that fail checks: send kError to every worker's connection.
  using Broadcast = std::function<void(const FrameHeader&, const std::string&)>;
  void set_error_broadcast(Broadcast b) { broadcast_error_ = std::move(b); }
  // Rack-level hierarchy: where relayed sums go up, and what ends the job when they cannot.
  void set_relay(RackRelay* relay, std::function<void(const std::string&)> fatal) {
    relay_ = relay;
    fatal_ = std::move(fatal);
  }
  uint64_t parts_summed() const { return parts_summed_ + compressed_.parts_summed(); }
  // Late pushes of quorum rounds: gradients' and outer deltas' (param_store.h).
  uint64_t late_pushes() const { return late_pushes_ + late_outer_; }
  uint64_t fetched_rounds() const { return fetched_rounds_; }
  uint64_t async_updates() const { return async_updates_; }
  uint64_t nudges() const { return nudges_; }

 private:
  // A part pushed as a shared-memory slot: summed in place, answered in place.
  struct SlotPart {
    Payload slot;
    uint32_t sender;
  };
  struct KeyState {
    Payload acc;                // sum of the parts that came as bytes (empty: none yet)
    std::vector<SlotPart> shm;  // parts in shared memory, summed when all are in
    uint32_t count = 0;         // pushes of this round so far, want-only ones included
    uint32_t contributed = 0;   // pushes that carried data
    uint32_t expected = 0;
    uint8_t dtype = 0;
    uint64_t len = 0;
    uint64_t tensor_bytes = 0;
    uint64_t round = 0;
    uint32_t first_rank = 0;
    std::vector<std::shared_ptr<Connection>> reply_to;
    std::vector<bool> wants;  // by rank: the pusher wants the result (else an empty answer)
    std::string error;        // set once the part can no longer be summed
    // Relayed parts: the owner's server id (kNotRelayed: summed here) and its pushers.
    uint32_t owner = kNotRelayed;
    uint64_t owner_pushers = 0;
  };
  static constexpr uint32_t kNotRelayed = 0xFFFFFFFFu;
  // A rack sum sent up to its owner: who gets the owner's answer.
  struct PendingRelay {
    std::vector<std::shared_ptr<Connection>> reply_to;
    uint32_t owner = 0;
  };
  void run();
  void handle(PushWork& w);
  void fail(KeyState& st, const FrameHeader& h, const std::string& msg);
  void complete(KeyState& st, const FrameHeader& h);
  // Quorum rounds: a push of a round that closed without it; answers it from history.
  void answer_late(PushWork& w);
  void refuse(const PushWork& w, const std::string& msg);
  // Relayed parts: the rack's sum goes up; the owner's answer (or error) comes down.
  void relay_up(KeyState& st, const FrameHeader& h);
  void relay_down(PushWork& w);
  // Sends rank a nudge for round `round` of part h.part of h.tensor, if its connection is known.
  void send_nudge(uint32_t rank, const FrameHeader& h, uint64_t round);
  // rank pushed (a part other than those): nudges it for its overdue parts here.
  void nudge_overdue(uint32_t rank, int64_t now_us);

  int index_;
  uint32_t num_workers_;
  uint32_t server_id_;
  Broadcast broadcast_error_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<PushWork> queue_;
  bool stop_ = false;
  std::thread thread_;
  bool threaded_ = true;
  // Inline mode: one caller sums at a time; a post from inside a sum (on the same
  // thread) waits in inline_pending_ until that sum returns.
  std::mutex inline_mu_;
  std::atomic<std::thread::id> inline_owner_{};
  std::deque<PushWork> inline_pending_;
  bool inline_stopped_ = false;
  std::unordered_map<uint64_t, KeyState> keys_;
  uint64_t parts_summed_ = 0;
  QuorumRounds quorum_;
  ParamStore params_;
  // Read by other threads (stats): copies of the counters the owners keep.
  std::atomic<uint64_t> late_pushes_{0};
  std::atomic<uint64_t> fetched_rounds_{0};  // catch-up fetches answered from the history
  std::atomic<uint64_t> async_updates_{0};
  std::atomic<uint64_t> late_outer_{0};
  std::atomic<uint64_t> nudges_{0};
  bool nudge_;
  int64_t nudge_overdue_us_;
  // Per rank, the parts half in without its copy, oldest first (EngineRules::nudge).
  struct Awaited {
    FrameHeader hdr;  // the push that made half (tensor, part, dtype, bytes)
    uint64_t round;
    int64_t since_us;
  };
  std::vector<std::deque<Awaited>> awaited_;
  // Per worker rank, the connection of its last push (never a rack relay's).
  std::vector<std::weak_ptr<Connection>> conn_of_rank_;
  CompressedSum compressed_;  // compressed parts' rounds (docs/guide/compression.md)
  RackRelay* relay_ = nullptr;
  std::function<void(const std::string&)> fatal_;
  std::unordered_map<uint64_t, PendingRelay> relays_;
};

}  // namespace fastps
