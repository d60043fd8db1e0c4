// The push scheduler alone: urgency order, credit, window, and that the window
// never deadlocks workers that queue the same tensors in different orders.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "worker/push_scheduler.h"

namespace fastps {
namespace {

PushTicket part(int priority, uint64_t tensor, uint32_t index, uint32_t server, size_t len) {
  PushTicket t;
  t.priority = priority;
  t.tensor = tensor;
  t.part = index;
  t.server = server;
  t.len = len;
  return t;
}

std::vector<UrgencyKey> keys(const std::vector<PushTicket>& ts) {
  std::vector<UrgencyKey> out;
  for (auto& t : ts) out.push_back(urgency(t));
  return out;
}

TEST(PushScheduler, TakesInUrgencyOrderAcrossServers) {
  PushScheduler s(1u << 30, 0, {1.0, 1.0});
  std::vector<PushTicket> in = {part(0, 7, 1, 0, 10), part(5, 9, 0, 1, 10), part(0, 7, 0, 1, 10),
                                part(0, 3, 2, 0, 10), part(5, 2, 4, 0, 10), part(-1, 1, 0, 1, 10),
                                part(5, 2, 3, 1, 10)};
  s.enqueue(in);
  std::vector<PushTicket> out;
  EXPECT_EQ(s.take_admissible(&out), in.size());
  // Priority first (higher first), then tensor id, then part index.
  std::vector<UrgencyKey> expect = keys(in);
  std::sort(expect.begin(), expect.end());
  EXPECT_EQ(keys(out), expect);
  EXPECT_EQ(out.front().priority, 5);
  EXPECT_EQ(out.front().tensor, 2u);
  EXPECT_EQ(out.front().part, 3u);
  EXPECT_EQ(out.back().priority, -1);
}

TEST(PushScheduler, LateUrgentPartOvertakesQueuedOnes) {
  PushScheduler s(100, 0, {1.0});
  s.enqueue({part(0, 1, 0, 0, 100), part(0, 1, 1, 0, 100), part(0, 1, 2, 0, 100)});
  std::vector<PushTicket> out;
  ASSERT_EQ(s.take_admissible(&out), 1u);  // credit holds one part
  s.enqueue({part(9, 5, 0, 0, 100)});
  s.written(0, 100);
  out.clear();
  ASSERT_EQ(s.take_admissible(&out), 1u);
  EXPECT_EQ(out[0].tensor, 5u);
}

TEST(PushScheduler, CreditLimitsUnwrittenBytesPerServer) {
  PushScheduler s(100, 0, {1.0, 1.0});
  s.enqueue({part(0, 1, 0, 0, 60), part(0, 1, 1, 0, 60), part(0, 2, 0, 1, 30), part(0, 2, 1, 1, 30),
             part(0, 2, 2, 1, 30), part(0, 2, 3, 1, 30)});
  std::vector<PushTicket> out;
  // Server 0: 60 fits, 60 + 60 does not. Server 1: three of 30 fit in 100.
  EXPECT_EQ(s.take_admissible(&out), 4u);
  EXPECT_EQ(s.unwritten_bytes(0), 60u);
  EXPECT_EQ(s.unwritten_bytes(1), 90u);
  EXPECT_EQ(s.queued(0), 1u);
  EXPECT_EQ(s.queued(1), 1u);
  out.clear();
  EXPECT_EQ(s.take_admissible(&out), 0u);
  s.written(0, 60);
  EXPECT_EQ(s.take_admissible(&out), 1u);
  EXPECT_EQ(out[0].server, 0u);
  s.written(1, 30);
  EXPECT_EQ(s.take_admissible(&out), 1u);
  EXPECT_EQ(s.queued(1), 0u);
}

TEST(PushScheduler, PartLargerThanCreditGoesAloneWhenNothingIsUnwritten) {
  PushScheduler s(100, 0, {1.0});
  s.enqueue({part(0, 1, 0, 0, 500), part(0, 1, 1, 0, 1)});
  std::vector<PushTicket> out;
  EXPECT_EQ(s.take_admissible(&out), 1u);
  EXPECT_EQ(out[0].len, 500u);
  s.written(0, 500);
  EXPECT_EQ(s.take_admissible(&out), 1u);
}

TEST(PushScheduler, WindowCountsOnlyMoreUrgentUnansweredParts) {
  PushScheduler s(1u << 30, 100, {1.0});
  s.enqueue({part(10, 1, 0, 0, 60), part(5, 2, 0, 0, 60)});
  std::vector<PushTicket> out;
  // The first goes (nothing ahead of it); the second would put 120 bytes in
  // the window behind 60 more urgent unanswered ones.
  ASSERT_EQ(s.take_admissible(&out), 1u);
  EXPECT_EQ(out[0].tensor, 1u);
  EXPECT_EQ(s.unanswered_bytes(0), 60u);
  // A part more urgent than everything unanswered is admitted at once.
  s.enqueue({part(20, 3, 0, 0, 60)});
  out.clear();
  ASSERT_EQ(s.take_admissible(&out), 1u);
  EXPECT_EQ(out[0].tensor, 3u);
  // Written bytes do not open the window; answers do.
  s.written(0, 120);
  out.clear();
  EXPECT_EQ(s.take_admissible(&out), 0u);
  s.answered(part(10, 1, 0, 0, 60));
  EXPECT_EQ(s.take_admissible(&out), 0u);  // tensor 3 (60 bytes) is still ahead
  s.answered(part(20, 3, 0, 0, 60));
  ASSERT_EQ(s.take_admissible(&out), 1u);
  EXPECT_EQ(out[0].tensor, 2u);
}

TEST(PushScheduler, WindowIsScaledByEachServersShare) {
  PushScheduler even(1, 1000, {2.0, 2.0});
  EXPECT_EQ(even.window(0), 1000u);
  EXPECT_EQ(even.window(1), 1000u);
  PushScheduler uneven(1, 1000, {1.0, 3.0});
  EXPECT_EQ(uneven.window(0), 500u);
  EXPECT_EQ(uneven.window(1), 1500u);
}

TEST(PushScheduler, DroppedPartsAreNotCharged) {
  PushScheduler s(100, 100, {1.0});
  s.enqueue({part(0, 1, 0, 0, 80), part(0, 1, 1, 0, 80)});
  std::vector<PushTicket> out;
  EXPECT_EQ(s.take_admissible(&out, [](const PushTicket& t) { return t.part != 0; }), 1u);
  EXPECT_EQ(out[0].part, 1u);
  EXPECT_EQ(s.unwritten_bytes(0), 80u);
  EXPECT_EQ(s.unanswered_bytes(0), 80u);
  EXPECT_EQ(s.queued(0), 0u);
}

TEST(PushScheduler, BoostedPartGoesFirstOutsideTheWindowButNotTheCredit) {
  PushScheduler s(100, 100, {1.0});
  PushTicket urgent = part(9, 1, 0, 0, 100), late = part(0, 2, 5, 0, 100);
  s.enqueue({urgent, part(5, 1, 1, 0, 100), late});
  std::vector<PushTicket> out;
  ASSERT_EQ(s.take_admissible(&out), 1u);  // the urgent part; credit and window now full
  EXPECT_EQ(urgency(out[0]), urgency(urgent));
  EXPECT_TRUE(s.boost(late));
  EXPECT_FALSE(s.boost(late));  // once
  out.clear();
  EXPECT_EQ(s.take_admissible(&out), 0u);  // credit still holds the first part
  s.written(0, 100);                       // the window (100 unanswered) would hold it
  ASSERT_EQ(s.take_admissible(&out), 1u);
  EXPECT_EQ(urgency(out[0]), urgency(late));
  EXPECT_EQ(s.boosts(), 1u);
  EXPECT_EQ(s.queued(0), 1u);
  EXPECT_FALSE(s.boost(late));  // taken: nothing to boost
  PushTicket other_round = part(5, 1, 1, 0, 100);
  other_round.tag = 7;  // a later push_pull's part: not the one queued
  EXPECT_FALSE(s.boost(other_round));
  EXPECT_FALSE(s.boost(part(0, 3, 0, 0, 100)));  // never queued
  EXPECT_FALSE(s.boost(part(0, 3, 0, 4, 100)));  // no such server
}

TEST(PushScheduler, BoostTakesOnlyAPartThatWaitedLongEnough) {
  PushScheduler s(100, 100, {1.0}, /*boost_min_wait_us=*/10000);
  PushTicket urgent = part(9, 1, 0, 0, 100), old = part(0, 2, 5, 0, 100),
             young = part(1, 3, 0, 0, 100);
  urgent.queued_us = old.queued_us = 1000;
  young.queued_us = 9000;
  s.enqueue({urgent, old, young});
  std::vector<PushTicket> out;
  ASSERT_EQ(s.take_admissible(&out), 1u);  // the urgent part; credit and window now full
  EXPECT_FALSE(s.boost(old, 10999));       // queued 9.999 ms: its worker is merely behind
  EXPECT_TRUE(s.boost(old, 11000));        // 10 ms: passed over, its server waits
  EXPECT_FALSE(s.boost(young, 11000));     // 2 ms
  EXPECT_EQ(s.boosts(), 1u);
  s.written(0, 100);
  out.clear();
  ASSERT_EQ(s.take_admissible(&out), 1u);  // the boosted one, outside the window
  EXPECT_EQ(urgency(out[0]), urgency(old));
  EXPECT_TRUE(s.boost(young, 19000));  // waited long enough now
}

TEST(PushScheduler, SamePartOfAFailedAndANewPushPullBothQueue) {
  PushScheduler s(1000, 0, {1.0});
  PushTicket old_round = part(1, 4, 0, 0, 10), new_round = part(1, 4, 0, 0, 10);
  old_round.tag = 1;
  new_round.tag = 2;
  s.enqueue({old_round});
  s.enqueue({new_round});
  EXPECT_EQ(s.queued(0), 2u);
  std::vector<PushTicket> out;
  // keep drops the failed push_pull's part, as the worker does; the new one goes
  EXPECT_EQ(s.take_admissible(&out, [](const PushTicket& t) { return t.tag == 2; }), 1u);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].tag, 2);
}

TEST(PushScheduler, BacklogCountsQueuedAndUnwrittenBytesOnce) {
  PushScheduler s(100, 0, {1.0, 1.0});
  EXPECT_EQ(s.backlog_bytes(), 0u);
  PushTicket a = part(0, 1, 0, 0, 60), b = part(0, 1, 1, 0, 60), c = part(0, 2, 0, 1, 30);
  s.enqueue({a, b, c});
  EXPECT_EQ(s.backlog_bytes(), 150u);
  EXPECT_TRUE(s.boost(b));  // a boosted part is still one queued part
  EXPECT_EQ(s.backlog_bytes(), 150u);
  std::vector<PushTicket> out;
  ASSERT_EQ(s.take_admissible(&out), 2u);  // b (boosted) on server 0, c on server 1
  EXPECT_EQ(s.backlog_bytes(), 150u);      // taken, not yet written
  s.written(0, 60);
  s.written(1, 30);
  EXPECT_EQ(s.backlog_bytes(), 60u);  // a is still queued
  out.clear();
  // A part dropped while queued (its push_pull failed) leaves the backlog unsent.
  EXPECT_EQ(s.take_admissible(&out, [](const PushTicket&) { return false; }), 0u);
  EXPECT_EQ(s.backlog_bytes(), 0u);
}

TEST(PushScheduler, RejectsUnknownServer) {
  PushScheduler s(100, 100, {1.0, 1.0});
  EXPECT_THROW(s.enqueue({part(0, 1, 0, 2, 8)}), std::out_of_range);
  EXPECT_EQ(s.queued(0) + s.queued(1), 0u);
}

TEST(PushScheduler, WaitWakesOnEnqueueAndOnStop) {
  PushScheduler s(100, 0, {1.0});
  std::vector<PushTicket> got;
  std::atomic<bool> returned{false};
  bool result = false;
  std::thread t([&] {
    result = s.wait_admissible(&got);
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(returned.load());
  s.enqueue({part(0, 4, 0, 0, 10)});
  t.join();
  EXPECT_TRUE(result);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].tensor, 4u);

  std::thread t2([&] { result = s.wait_admissible(&got); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  s.stop();
  t2.join();
  EXPECT_FALSE(result);
}

// The network thread takes what freed credit admits (Worker::pump): written() and
// answered() say whether the server admits its head now, and wake the push thread only
// when asked to.
TEST(PushScheduler, WrittenAndAnsweredSayWhetherTheServerAdmitsItsHead) {
  PushScheduler s(200, 100, {1.0});
  s.enqueue({part(0, 1, 0, 0, 100), part(0, 1, 1, 0, 100), part(0, 1, 2, 0, 100)});
  std::vector<PushTicket> out;
  ASSERT_EQ(s.take_admissible(&out), 1u);  // the window (100) holds one unanswered part
  // Written, but the window still binds: nothing admitted.
  EXPECT_FALSE(s.written(0, 100, false));
  // Answered: the next part is admissible, and the caller takes it itself.
  EXPECT_TRUE(s.answered(out[0], false));
  out.clear();
  ASSERT_EQ(s.take_admissible(&out, nullptr, true), 1u);
  EXPECT_EQ(out[0].part, 1u);
  // With wake = true a push thread asleep in wait_admissible takes the last part.
  std::vector<PushTicket> got;
  std::thread waiter([&] { s.wait_admissible(&got); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(s.written(0, 100, true));  // the window still binds
  EXPECT_TRUE(s.answered(out[0], true));
  waiter.join();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].part, 2u);
  // Nothing left: neither says the server admits anything.
  EXPECT_FALSE(s.written(0, 100, false));
  EXPECT_FALSE(s.answered(got[0], false));
}

TEST(PushScheduler, LightOnlyStopsAtAHeavyPartAndWakesThePushThread) {
  PushScheduler s(1u << 20, 0, {1.0, 1.0});
  PushTicket heavy = part(5, 2, 0, 1, 10);
  heavy.light = false;
  s.enqueue({part(9, 1, 0, 0, 10), heavy, part(0, 3, 0, 0, 10)});
  std::vector<PushTicket> out;
  // The light urgent part is taken; the heavy one is next in urgency: stop there, though
  // a lighter, less urgent part is admissible, so the push order stays the urgency order.
  EXPECT_EQ(s.take_admissible(&out, nullptr, true), 1u);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].tensor, 1u);
  EXPECT_EQ(s.queued(0) + s.queued(1), 2u);
  // The push thread was woken for it: a waiter returns at once with both parts.
  std::vector<PushTicket> got;
  EXPECT_TRUE(s.wait_admissible(&got));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].tensor, 2u);
  EXPECT_EQ(got[1].tensor, 3u);
}

// A small push_pull's caller queues without waking the push thread and takes what is
// admissible itself (Worker::enqueue_parts); a part that is not light still reaches the
// push thread, woken by the caller's take.
TEST(PushScheduler, CallerTakesItsOwnLightPartsAndHandsOnHeavyOnes) {
  PushScheduler s(1u << 20, 0, {1.0, 1.0});
  std::atomic<int> woken{0};
  std::vector<PushTicket> got;
  std::thread push_thread([&] {
    while (s.wait_admissible(&got)) {
      woken.fetch_add(1);
      break;
    }
  });
  s.enqueue({part(0, 1, 0, 0, 10)}, false);
  std::vector<PushTicket> out;
  EXPECT_EQ(s.take_admissible(&out, nullptr, true), 1u);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].tensor, 1u);
  PushTicket heavy = part(0, 2, 0, 1, 10);
  heavy.light = false;
  s.enqueue({heavy}, false);
  out.clear();
  EXPECT_EQ(s.take_admissible(&out, nullptr, true), 0u);
  EXPECT_TRUE(out.empty());
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (woken.load() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  s.stop();
  push_thread.join();
  ASSERT_EQ(woken.load(), 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].tensor, 2u);  // the push thread took the heavy part, not the light one
}

// Workers with their own schedulers push to shared servers; a server answers a
// part once every worker pushed it. Each worker queues the same tensors (same
// priorities, same parts) but in its own order and at its own pace, while the
// window is small enough to bind. The run must always finish.
struct Sim {
  struct Tensor {
    uint64_t id;
    int priority;
    std::vector<PushTicket> parts;
  };
  size_t workers, servers;
  std::vector<Tensor> tensors;
  std::vector<std::unique_ptr<PushScheduler>> sched;
  std::vector<std::vector<size_t>> order;          // per worker: tensor indices in queueing order
  std::vector<size_t> next;                        // per worker: how many it queued
  std::map<UrgencyKey, std::set<size_t>> pushed;   // part -> workers that pushed it
  std::vector<std::vector<PushTicket>> unwritten;  // per worker, in push order
  size_t answered = 0, total_parts = 0;

  Sim(std::mt19937* rng, size_t w, size_t s, size_t n_tensors, size_t window)
      : workers(w), servers(s) {
    std::vector<double> weights(servers);
    for (auto& x : weights) x = 1.0 + (*rng)() % 3;
    std::uniform_int_distribution<int> prio(0, 3);
    for (size_t i = 0; i < n_tensors; ++i) {
      Tensor t{1000 + i * 7919, prio(*rng), {}};
      size_t nparts = 1 + (*rng)() % 4;
      for (uint32_t p = 0; p < nparts; ++p)
        t.parts.push_back(part(t.priority, t.id, p, static_cast<uint32_t>((*rng)() % servers),
                               16 + (*rng)() % (window ? window : 64)));
      total_parts += nparts;
      tensors.push_back(t);
    }
    for (size_t k = 0; k < workers; ++k) {
      sched.push_back(std::make_unique<PushScheduler>(window ? window / 2 : 64, window, weights));
      std::vector<size_t> o(n_tensors);
      for (size_t i = 0; i < n_tensors; ++i) o[i] = i;
      std::shuffle(o.begin(), o.end(), *rng);
      order.push_back(o);
    }
    next.assign(workers, 0);
    unwritten.assign(workers, {});
  }

  // One step of worker k; returns whether anything happened.
  bool step(size_t k, std::mt19937* rng) {
    bool acted = false;
    // Queue the next tensor now and then (a framework submits as gradients come).
    if (next[k] < order[k].size() && (*rng)() % 2 == 0) {
      sched[k]->enqueue(tensors[order[k][next[k]++]].parts);
      acted = true;
    }
    std::vector<PushTicket> out;
    sched[k]->take_admissible(&out);
    for (auto& t : out) {
      unwritten[k].push_back(t);
      acted = true;
    }
    // The socket drains some of what was handed to it.
    while (!unwritten[k].empty() && (*rng)() % 3 != 0) {
      PushTicket t = unwritten[k].front();
      unwritten[k].erase(unwritten[k].begin());
      sched[k]->written(t.server, t.len);
      auto& who = pushed[urgency(t)];
      EXPECT_TRUE(who.insert(k).second) << "worker " << k << " pushed a part twice";
      if (who.size() == workers) {
        for (auto& s : sched) s->answered(t);
        ++answered;
      }
      acted = true;
    }
    return acted;
  }

  // Runs until every part is answered; false if no worker can move any more.
  bool run(std::mt19937* rng) {
    size_t idle_rounds = 0;
    while (answered < total_parts) {
      bool any = false;
      for (size_t k = 0; k < workers; ++k) any = step((*rng)() % workers, rng) || any;
      bool all_queued = true;
      for (size_t k = 0; k < workers; ++k) all_queued = all_queued && next[k] == order[k].size();
      idle_rounds = any || !all_queued ? 0 : idle_rounds + 1;
      if (idle_rounds > 50) return false;
    }
    return true;
  }
};

TEST(PushScheduler, WindowNeverDeadlocksWorkersThatQueueInDifferentOrders) {
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    std::mt19937 rng(seed);
    size_t workers = 2 + seed % 3, servers = 1 + seed % 3;
    Sim sim(&rng, workers, servers, 6 + seed % 10, seed % 5 == 0 ? 0 : 64 + seed % 200);
    ASSERT_TRUE(sim.run(&rng)) << "seed " << seed << ": " << sim.answered << " of "
                               << sim.total_parts << " parts answered, then no worker could push";
  }
}

}  // namespace
}  // namespace fastps
