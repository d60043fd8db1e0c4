// Asynchronous mode (docs/guide/async.md, BytePS §5): the server keeps each parameter part.
// Rank 0 sets its value (kFlagAsyncInit with data; the other workers' init pushes carry no
// data and receive that value). A worker's update (kFlagAsync) is the delta its local
// optimizer step made; the server adds it and answers with the current parameters, so one
// exchange both pushes and pulls. kFlagAsync with kFlagNoData only reads them (checkpoints).
// Bounded staleness (SSP, FASTPS_STALENESS = s): each worker's updates of a part are its
// clock; the answer to a worker's update at clock c is held until every worker's clock is
// at least c - s, so no worker runs more than s updates ahead of the slowest; s = 0 makes
// the answer the parameters after every worker's c-th update (synchronous), s < 0 never holds.
// Outer-optimizer parts (local SGD / DiLoCo, server/outer_optimizer.h): rank 0's init carries
// an OuterHeader (protocol/messages.h) in front of the part; from then on the part's updates
// are synchronous rounds of every worker's delta, answered once all n are in with the
// parameters after the outer step. They ignore the staleness bound.
// Quorum rounds (FASTPS_ROUND_QUORUM = k, server/quorum.h) apply to outer rounds too: a round
// closes once k deltas are in, the outer step takes the mean of those k, and a delta of a
// round that closed without it is dropped and answered with the very bytes that round's
// pushers got (the parameters after it), from the last FASTPS_QUORUM_HISTORY rounds kept;
// a round closes early only while every worker's next round is still kept.
// A delta may travel compressed (kOuterCompressed: one compressed part after the header);
// it is decoded to float32 and summed in float64 like the others.
// Owned by one engine thread (no lock).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "protocol/messages.h"
#include "server/outer_optimizer.h"
#include "server/quorum.h"
#include "transport/connection.h"
#include "transport/payload.h"

namespace fastps {

class ParamStore {
 public:
  // quorum, quorum_fraction, quorum_history: FASTPS_ROUND_QUORUM (a count or a fraction;
  // 0: every worker) and FASTPS_QUORUM_HISTORY, for the outer-optimizer parts' rounds.
  ParamStore(uint32_t num_workers, int64_t staleness, uint32_t server_id, uint32_t quorum = 0,
             double quorum_fraction = 0, uint32_t quorum_history = 8);
  // One async push (payload in `data`). Returns why it was refused (its sender is then told
  // with kError by the caller), or an empty string.
  std::string handle(const std::shared_ptr<Connection>& conn, const FrameHeader& h,
                     const Payload& data);
  uint64_t updates() const { return updates_; }
  uint64_t held_answers() const { return held_answers_; }
  uint64_t outer_steps() const { return outer_steps_; }
  // Outer deltas of rounds that had closed without them (dropped, answered from history).
  uint64_t late_outer() const { return late_outer_; }
  // Outer deltas that arrived compressed.
  uint64_t compressed_deltas() const { return compressed_deltas_; }
  // Deltas per outer round before it may close (every worker unless a quorum is set).
  uint32_t outer_needed() const { return quorum_.needed(num_workers_); }

 private:
  struct Waiter {
    std::shared_ptr<Connection> conn;
    FrameHeader hdr;
    uint64_t clock;
  };
  // An outer-optimizer part's state beside its value (value = OuterHeader + elements).
  struct Outer {
    explicit Outer(const OuterConfig& c) : opt(c) {}
    OuterOptimizer opt;
    std::vector<double> params;  // float64 master copy: the answers are it, rounded
    std::vector<double> acc;     // this round's sum of deltas
    std::vector<float> decoded;  // a compressed delta, decoded
    std::vector<bool> pushed;    // by rank: its delta of this round is in
    uint32_t count = 0;
    uint64_t round = 0;           // outer steps done
    std::vector<Waiter> waiting;  // this round's pushers
  };
  struct Part {
    std::vector<char> value;
    bool ready = false;  // rank 0's value arrived
    uint8_t dtype = 0;
    uint64_t tensor_bytes = 0;
    std::vector<uint64_t> clock;    // by rank: updates applied
    std::vector<Waiter> held;       // update answers waiting for the slowest (SSP)
    std::vector<Waiter> for_value;  // init pushes waiting for rank 0's value
    std::unique_ptr<Outer> outer;   // set: an outer-optimizer part
    std::string refused;            // why rank 0's outer init was refused (until a good one)
  };
  // shorter: an update may be shorter than the part (a compressed delta; update_outer checks it).
  std::string check(const Part& p, const FrameHeader& h, bool shorter = false) const;
  void answer(const Part& p, const std::shared_ptr<Connection>& conn, const FrameHeader& h) const;
  void release(Part& p);
  // Outer-optimizer parts: rank 0's init with its header `oh`, and a worker's delta.
  std::string init_outer(Part& p, const std::shared_ptr<Connection>& conn, const FrameHeader& h,
                         const Payload& data, const OuterHeader& oh);
  std::string update_outer(Part& p, const std::shared_ptr<Connection>& conn, const FrameHeader& h,
                           const Payload& data);
  // Adds one delta's values (after its header) to the round's sum, decoding a compressed one;
  // returns why it cannot be read, or "".
  std::string add_delta(Part& p, const FrameHeader& h, const Payload& data, const OuterHeader& oh);
  // A delta of a round that closed without it: answered from the quorum history.
  std::string late_outer(Part& p, const std::shared_ptr<Connection>& conn, const FrameHeader& h,
                         const OuterHeader& oh);
  // Takes the outer step with the mean of the deltas in and answers the round's pushers.
  void close_round(Part& p, uint64_t key);
  // Refuses every pusher waiting on this round of an outer part and starts the round again.
  void fail_round(Part& p, const std::string& msg);
  // Tells a waiting worker its push cannot be served (kError, like the engine's refusals).
  void refuse(const std::shared_ptr<Connection>& conn, const FrameHeader& h,
              const std::string& msg) const;

  uint32_t num_workers_;
  int64_t staleness_;
  uint32_t server_id_;
  std::unordered_map<uint64_t, Part> parts_;
  uint64_t updates_ = 0;
  uint64_t held_answers_ = 0;
  uint64_t outer_steps_ = 0;
  uint64_t late_outer_ = 0;
  uint64_t compressed_deltas_ = 0;
  QuorumRounds quorum_;  // the outer parts' rounds (keyed by part key, like parts_)
  bool quorum_on_;       // a round may close before every worker's delta is in
};

}  // namespace fastps
