#include "worker/push_scheduler.h"

#include <stdexcept>
#include <string>

namespace fastps {

PushScheduler::PushScheduler(size_t credit_bytes, size_t window_bytes,
                             const std::vector<double>& server_weights, int64_t boost_min_wait_us)
    : credit_bytes_(credit_bytes),
      window_bytes_(window_bytes),
      boost_min_wait_us_(boost_min_wait_us) {
  double total = 0;
  for (double w : server_weights) total += w;
  // A server that must receive more bytes needs more of them under way.
  for (double w : server_weights)
    window_.push_back(total > 0 ? static_cast<size_t>(static_cast<double>(window_bytes) * w /
                                                      total * server_weights.size())
                                : window_bytes);
  queues_.resize(server_weights.size());
  boosted_.resize(server_weights.size());
  unwritten_.assign(server_weights.size(), 0);
  unanswered_.assign(server_weights.size(), {});
}

void PushScheduler::enqueue(const std::vector<PushTicket>& parts, bool wake) {
  for (auto& p : parts)
    if (p.server >= queues_.size())
      throw std::out_of_range("part " + std::to_string(p.part) + " of tensor id " +
                              std::to_string(p.tensor) + " is for server " +
                              std::to_string(p.server) + " of " + std::to_string(queues_.size()));
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& p : parts)
      if (queues_[p.server].insert(p).second) queued_bytes_ += p.len;
  }
  if (wake) cv_.notify_one();
}

const PushTicket* PushScheduler::head_locked(size_t s, bool* boosted) const {
  *boosted = !boosted_[s].empty();
  if (*boosted) return &*boosted_[s].begin();
  return queues_[s].empty() ? nullptr : &*queues_[s].begin();
}

bool PushScheduler::admits_locked(size_t s) const {
  bool boosted = false;
  const PushTicket* head = head_locked(s, &boosted);
  if (!head) return false;
  const PushTicket& next = *head;
  if (unwritten_[s] != 0 && unwritten_[s] + next.len > credit_bytes_) return false;
  if (window_bytes_ == 0 || boosted) return true;
  UrgencyKey key = urgency(next);
  size_t ahead = 0;
  for (auto& kv : unanswered_[s]) {
    if (!(kv.first < key)) break;
    ahead += kv.second;
  }
  return ahead == 0 || ahead + next.len <= window_[s];
}

size_t PushScheduler::take_admissible(std::vector<PushTicket>* out,
                                      const std::function<bool(const PushTicket&)>& keep,
                                      bool light_only) {
  bool wake = false;
  size_t taken = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!stop_) {
      // The most urgent part among the servers that admit one; boosted parts first.
      size_t best = queues_.size();
      const PushTicket* pick = nullptr;
      bool pick_boosted = false;
      for (size_t s = 0; s < queues_.size(); ++s) {
        if (!admits_locked(s)) continue;
        bool boosted = false;
        const PushTicket* head = head_locked(s, &boosted);
        if (!pick || (boosted && !pick_boosted) ||
            (boosted == pick_boosted && urgency(*head) < urgency(*pick))) {
          best = s;
          pick = head;
          pick_boosted = boosted;
        }
      }
      if (!pick) break;
      if (light_only && !pick->light) {
        wake = true;  // the push thread sends it (compressing on the way)
        break;
      }
      PushTicket t = *pick;
      queues_[best].erase(t);
      boosted_[best].erase(t);
      queued_bytes_ -= t.len;
      if (keep && !keep(t)) continue;
      unwritten_[best] += t.len;
      unanswered_[best][urgency(t)] = t.len;
      out->push_back(t);
      ++taken;
    }
  }
  if (wake) cv_.notify_one();
  return taken;
}

bool PushScheduler::wait_admissible(std::vector<PushTicket>* out,
                                    const std::function<bool(const PushTicket&)>& keep) {
  out->clear();
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Woken by enqueue, written, answered and stop: the only events that
      // can open a queue. An internal thread's wait, ended by stop().
      cv_.wait(lock, [&] {
        if (stop_) return true;
        for (size_t s = 0; s < queues_.size(); ++s)
          if (admits_locked(s)) return true;
        return false;
      });
      if (stop_) return false;
    }
    // Every admissible head may have been dropped by keep: then wait again.
    if (take_admissible(out, keep) > 0) return true;
  }
}

// written() and answered() change only their server's limits, so they wake the push
// thread only when that server now admits its head: every other wakeup would find
// nothing to take and cost a futex wake and two context switches per part. With a credit
// of several parts, written() waits until half of it is free, so that one wake-up hands
// the transport several parts (one writev) instead of one part per wake-up.
bool PushScheduler::written(uint32_t server, size_t len, bool wake) {
  bool ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    size_t& left = unwritten_.at(server);
    left -= len;
    ready = (left == 0 || left <= credit_bytes_ / 2) && admits_locked(server);
  }
  if (ready && wake) cv_.notify_one();
  return ready;
}

bool PushScheduler::answered(const PushTicket& t, bool wake) {
  bool ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    unanswered_.at(t.server).erase(urgency(t));
    ready = admits_locked(t.server);
  }
  if (ready && wake) cv_.notify_one();
  return ready;
}

bool PushScheduler::boost(const PushTicket& t, int64_t now_us) {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (t.server >= queues_.size()) return false;
    auto it = queues_[t.server].find(t);
    if (it == queues_[t.server].end()) return false;
    if (now_us - it->queued_us < boost_min_wait_us_) return false;
    if (!boosted_[t.server].insert(*it).second) return false;
    ++boosts_;
    wake = admits_locked(t.server);
  }
  if (wake) cv_.notify_one();
  return true;
}

void PushScheduler::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
}

size_t PushScheduler::queued(size_t server) const {
  std::lock_guard<std::mutex> lock(mu_);
  return queues_.at(server).size();
}

uint64_t PushScheduler::boosts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return boosts_;
}

size_t PushScheduler::unwritten_bytes(size_t server) const {
  std::lock_guard<std::mutex> lock(mu_);
  return unwritten_.at(server);
}

size_t PushScheduler::backlog_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = queued_bytes_;
  for (size_t u : unwritten_) n += u;
  return n;
}

size_t PushScheduler::unanswered_bytes(size_t server) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (auto& kv : unanswered_.at(server)) n += kv.second;
  return n;
}

}  // namespace fastps
