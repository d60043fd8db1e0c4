#include "server/quorum.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "kernels/sum.h"

namespace fastps {

QuorumRounds::QuorumRounds(uint32_t quorum, double fraction, uint32_t history, uint32_t num_workers)
    : quorum_(quorum),
      fraction_(fraction),
      history_(std::max<uint32_t>(history, 1)),
      num_workers_(num_workers) {}

uint32_t QuorumRounds::needed(uint32_t expected) const {
  uint32_t k = expected;
  if (quorum_) k = quorum_;
  if (fraction_ > 0) k = static_cast<uint32_t>(std::ceil(fraction_ * expected - 1e-9));
  return std::min(std::max<uint32_t>(k, 1), expected);
}

void QuorumRounds::note_push(uint64_t key, uint32_t sender, uint64_t round) {
  PartRounds& p = parts_[key];
  if (p.last.empty()) p.last.assign(num_workers_, -1);
  if (p.last[sender] < 0) p.seen++;
  p.last[sender] = std::max<int64_t>(p.last[sender], static_cast<int64_t>(round));
}

bool QuorumRounds::may_close(uint64_t key, uint64_t round, uint32_t count,
                             uint32_t expected) const {
  if (count >= expected) return true;
  if (count < needed(expected)) return false;
  // Closing `round` keeps rounds round-history+1 .. round; every pusher's next push
  // (its last round + 1) must be among them or still open.
  auto it = parts_.find(key);
  int64_t slowest = -1;  // a pusher not seen yet has pushed nothing
  if (it != parts_.end() && it->second.seen >= expected) {
    slowest = INT64_MAX;
    for (int64_t r : it->second.last)
      if (r >= 0) slowest = std::min(slowest, r);
  }
  return static_cast<int64_t>(round) + 1 - static_cast<int64_t>(history_) <= slowest + 1;
}

double QuorumRounds::finish(uint64_t key, uint64_t round, char* data, uint64_t len, DType dt,
                            uint32_t count, uint32_t expected) {
  double factor = 1.0;
  bool floating = dt == DType::kFloat32 || dt == DType::kFloat64 || dt == DType::kFloat16 ||
                  dt == DType::kBFloat16;
  if (count < expected && floating) {
    factor = static_cast<double>(expected) / count;
    scale(data, len / dtype_size(dt), dt, factor);
  }
  keep(key, round, std::make_shared<std::vector<char>>(data, data + len));
  return factor;
}

void QuorumRounds::keep(uint64_t key, uint64_t round, std::shared_ptr<std::vector<char>> bytes) {
  PartRounds& p = parts_[key];
  if (p.last.empty()) p.last.assign(num_workers_, -1);
  p.history.push_back(Closed{round, std::move(bytes)});
  while (p.history.size() > history_) p.history.pop_front();
}

std::shared_ptr<std::vector<char>> QuorumRounds::result_of(uint64_t key, uint64_t round,
                                                           std::string* why) const {
  auto it = parts_.find(key);
  if (it != parts_.end())
    for (auto& c : it->second.history)
      if (c.round == round) return c.bytes;
  std::ostringstream os;
  os << "round " << round << " closed without this push and is no longer kept (the server keeps "
     << history_ << " closed rounds; FASTPS_QUORUM_HISTORY)";
  *why = os.str();
  return nullptr;
}

}  // namespace fastps
