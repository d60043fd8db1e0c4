// The sum engine's nudges (server/engine.h): which pushers of a part it tells to push it
// next, and when. Pushes are handed to the engine directly, each from its own recording
// connection, so every nudge and answer it sends can be counted without a network.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "protocol/messages.h"
#include "recording_conn.h"
#include "server/engine.h"
#include "transport/connection.h"
#include "transport/wire.h"

namespace fastps {
namespace {

struct Job {
  uint32_t workers;
  SumEngine engine;
  std::vector<std::shared_ptr<RecordingConn>> conns;

  // overdue_us: how long a part must have been half in before a skip is nudged.
  explicit Job(uint32_t n, int64_t overdue_us = 0, bool nudge = true)
      : workers(n), engine(0, n, 7, rules(nudge, overdue_us)) {
    for (uint32_t r = 0; r < n; ++r) conns.push_back(std::make_shared<RecordingConn>(r));
    engine.start(false);  // pushes are summed on the caller's thread: no waiting in tests
    // Every rank pushes a part of its own first, so the engine knows each one's connection.
    for (uint32_t r = 0; r < n; ++r) push(r, 99, r);
  }
  ~Job() { engine.stop(); }
  static EngineRules rules(bool nudge, int64_t overdue_us) {
    EngineRules r;
    r.nudge = nudge;
    r.nudge_overdue_us = overdue_us;
    return r;
  }

  void push(uint32_t rank, uint64_t tensor, uint32_t part) {
    auto buf = std::make_shared<std::vector<float>>(4, static_cast<float>(rank + 1));
    FrameHeader h{};
    h.magic = kFrameMagic;
    h.type = static_cast<uint8_t>(MsgType::kPush);
    h.dtype = static_cast<uint8_t>(DType::kFloat32);
    h.sender = rank;
    h.part = part;
    h.tensor = tensor;
    h.len = buf->size() * sizeof(float);
    h.tensor_bytes = h.len;
    engine.post(PushWork{conns[rank], h, Payload::memory(buf->data(), h.len, buf)});
  }
  int nudged(uint32_t rank, uint64_t tensor, uint32_t part) {
    return conns[rank]->count(MsgType::kNudge, tensor, part);
  }
  int answered(uint32_t rank, uint64_t tensor, uint32_t part) {
    return conns[rank]->count(MsgType::kResult, tensor, part);
  }
};

TEST(EngineNudges, APusherThatSkipsAHalfInPartIsNudgedWhenItPushesAnother) {
  Job job(4);
  job.push(0, 5, 1);
  job.push(2, 5, 1);  // half in: ranks 1 and 3 are awaited, nobody is told yet
  for (uint32_t r = 0; r < 4; ++r) EXPECT_EQ(job.nudged(r, 5, 1), 0) << "rank " << r;
  job.push(1, 50, 0);  // rank 1 pushes something else: it skipped (5, 1)
  EXPECT_EQ(job.nudged(1, 5, 1), 1);
  EXPECT_EQ(job.nudged(3, 5, 1), 0);
  job.push(1, 51, 0);  // told once per round, not once per push
  EXPECT_EQ(job.nudged(1, 5, 1), 1);
  job.push(3, 5, 1);  // rank 3 pushes the part itself: never told about it
  job.push(3, 50, 0);
  EXPECT_EQ(job.nudged(3, 5, 1), 0);
  EXPECT_EQ(job.nudged(1, 5, 1), 2) << "every copy but rank 1's: told again at once";
  job.push(1, 5, 1);
  for (uint32_t r = 0; r < 4; ++r) {
    EXPECT_EQ(job.answered(r, 5, 1), 1) << "rank " << r;
    EXPECT_EQ(job.nudged(r, 5, 1), r == 1 ? 2 : 0) << "rank " << r;
  }
  EXPECT_EQ(job.engine.nudges(), 2u);
}

TEST(EngineNudges, APusherMerelyBehindIsNotNudgedBeforeTheOverdueTime) {
  Job job(4, 3600LL * 1000 * 1000);
  job.push(0, 5, 0);
  job.push(1, 5, 0);
  job.push(2, 6, 0);  // rank 2 pushes on, but (5, 0) has not been half in for an hour
  job.push(3, 6, 0);
  EXPECT_EQ(job.nudged(2, 5, 0) + job.nudged(3, 5, 0), 0);
  job.push(2, 5, 0);  // every copy but rank 3's: the last one is told at once
  EXPECT_EQ(job.nudged(3, 5, 0), 1);
  EXPECT_EQ(job.engine.nudges(), 1u);
}

TEST(EngineNudges, ThreePushersNudgeOnlyTheLast) {
  Job job(3);
  job.push(2, 8, 0);
  EXPECT_EQ(job.nudged(0, 8, 0) + job.nudged(1, 8, 0), 0);
  job.push(0, 8, 0);  // two of three: the last is told at once
  EXPECT_EQ(job.nudged(1, 8, 0), 1);
  job.push(1, 8, 0);
  EXPECT_EQ(job.engine.nudges(), 1u);
}

TEST(EngineNudges, TwoPushersAndNudgesOffSendNone) {
  {
    Job job(2);
    job.push(0, 3, 0);
    job.push(1, 3, 0);
    EXPECT_EQ(job.engine.nudges(), 0u);
    EXPECT_EQ(job.answered(0, 3, 0) + job.answered(1, 3, 0), 2);
  }
  Job off(4, 0, false);
  off.push(0, 3, 0);
  off.push(1, 3, 0);
  off.push(2, 4, 0);
  off.push(2, 3, 0);
  EXPECT_EQ(off.engine.nudges(), 0u);
}

TEST(EngineNudges, ARankWithNoConnectionYetIsSkipped) {
  Job job(4);
  job.conns[2] = std::make_shared<RecordingConn>(2);  // never pushed on this connection
  job.push(0, 6, 0);
  job.push(3, 6, 0);
  job.push(1, 6, 0);  // every copy but rank 2's: its old connection is the one known
  EXPECT_EQ(job.nudged(2, 6, 0), 0) << "the nudge went to the connection rank 2 pushed on";
  EXPECT_EQ(job.engine.nudges(), 1u);
}

}  // namespace
}  // namespace fastps
