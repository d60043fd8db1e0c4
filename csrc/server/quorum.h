// Straggler-tolerant rounds (docs/guide/async.md): with FASTPS_ROUND_QUORUM = k, a server closes
// a part's round once k of its n pushers are in, instead of all n, and answers with the sum
// scaled by n/k (so a worker's usual division by n yields the mean over the k counted).
// A push of a round that already closed (a late one) is dropped: its sender gets the very
// bytes the others got, kept in a short history of closed rounds. A round closes early only
// while every pusher's next round is still in that history, so a worker may lag at most
// `history` rounds; past that the round waits for all n, as a plain round does.
// Owned by one engine thread (no lock), like the engine's other per-part state.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/dtype.h"

namespace fastps {

class QuorumRounds {
 public:
  QuorumRounds(uint32_t quorum, double fraction, uint32_t history, uint32_t num_workers);
  // Pushes a round of `expected` pushers needs before it may close (expected when off).
  uint32_t needed(uint32_t expected) const;
  // Records that `sender` pushed `round` of this part.
  void note_push(uint64_t key, uint32_t sender, uint64_t round);
  // Whether open round `round`, with `count` of `expected` in, may close now.
  bool may_close(uint64_t key, uint64_t round, uint32_t count, uint32_t expected) const;
  // The round closed: scales the sum in place (floating dtypes; integer sums are counts and
  // stay as summed) and keeps a copy for late pushers. Returns the factor applied.
  double finish(uint64_t key, uint64_t round, char* data, uint64_t len, DType dt, uint32_t count,
                uint32_t expected);
  // Keeps `bytes` as closed round `round`'s answer for late pushers (finish does it for sums;
  // the outer optimizer's parts keep their answers, the parameters after the round).
  void keep(uint64_t key, uint64_t round, std::shared_ptr<std::vector<char>> bytes);
  // The kept result of a closed round, or null with *why saying what went wrong.
  std::shared_ptr<std::vector<char>> result_of(uint64_t key, uint64_t round,
                                               std::string* why) const;
  bool knows(uint64_t key) const { return parts_.count(key) != 0; }
  void forget(uint64_t key) { parts_.erase(key); }
  uint64_t late_pushes() const { return late_pushes_; }
  void count_late() { ++late_pushes_; }

 private:
  struct Closed {
    uint64_t round;
    std::shared_ptr<std::vector<char>> bytes;
  };
  struct PartRounds {
    std::vector<int64_t> last;  // by rank: last round pushed (-1: none yet)
    uint32_t seen = 0;          // distinct pushers so far
    std::deque<Closed> history;
  };
  uint32_t quorum_;
  double fraction_;
  uint32_t history_;
  uint32_t num_workers_;
  std::unordered_map<uint64_t, PartRounds> parts_;
  uint64_t late_pushes_ = 0;
};

}  // namespace fastps
