// The servers' outer optimizer (server/outer_optimizer.h): the update rule against steps
// computed by hand in float64, its checks, the dtype conversions, and the in-band header's
// check word (protocol/messages.h). The parameter store's outer rounds
// (server/param_store.h) against a connection that records the answers: quorum rounds
// (the mean of the first k deltas, late deltas answered from history, the lag bound) and
// compressed deltas.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "compression/part_codec.h"
#include "kernels/half.h"
#include "protocol/flags.h"
#include "protocol/messages.h"
#include "recording_conn.h"
#include "server/outer_optimizer.h"
#include "server/param_store.h"
#include "transport/connection.h"

namespace fastps {
namespace {

TEST(OuterOptimizer, NesterovMatchesHandComputedSteps) {
  // lr 0.7, momentum 0.9, Nesterov; two parameters, three rounds.
  OuterOptimizer opt(OuterConfig{0.7, 0.9, true});
  std::vector<double> p = {1.0, -2.0};
  // Round 1: mean delta (0.1, -0.4): g = (-0.1, 0.4); m = g; u = g + 0.9 m = 1.9 g.
  std::vector<double> d1 = {0.1, -0.4};
  opt.step(p.data(), d1.data(), 2);
  double m0 = -0.1, m1 = 0.4;
  double p0 = 1.0 - 0.7 * (-0.1 + 0.9 * m0);
  double p1 = -2.0 - 0.7 * (0.4 + 0.9 * m1);
  EXPECT_DOUBLE_EQ(p[0], p0);
  EXPECT_DOUBLE_EQ(p[1], p1);
  EXPECT_DOUBLE_EQ(p[0], 1.133);   // 1 + 0.7 * 0.19
  EXPECT_DOUBLE_EQ(p[1], -2.532);  // -2 - 0.7 * 0.76
  // Round 2: mean delta (0.05, 0.2): g = (-0.05, -0.2); m = 0.9 m + g.
  std::vector<double> d2 = {0.05, 0.2};
  opt.step(p.data(), d2.data(), 2);
  m0 = 0.9 * m0 + -0.05;  // -0.14
  m1 = 0.9 * m1 + -0.2;   // 0.16
  p0 -= 0.7 * (-0.05 + 0.9 * m0);
  p1 -= 0.7 * (-0.2 + 0.9 * m1);
  EXPECT_DOUBLE_EQ(p[0], p0);
  EXPECT_DOUBLE_EQ(p[1], p1);
  EXPECT_NEAR(p[0], 1.133 + 0.7 * 0.176, 1e-12);
  EXPECT_NEAR(p[1], -2.532 + 0.7 * 0.056, 1e-12);
  // Round 3: no movement: the momentum alone moves the parameters.
  std::vector<double> d3 = {0.0, 0.0};
  opt.step(p.data(), d3.data(), 2);
  m0 *= 0.9;
  m1 *= 0.9;
  p0 -= 0.7 * (0.9 * m0);
  p1 -= 0.7 * (0.9 * m1);
  EXPECT_DOUBLE_EQ(p[0], p0);
  EXPECT_DOUBLE_EQ(p[1], p1);
  ASSERT_EQ(opt.momentum_buffer().size(), 2u);
  EXPECT_DOUBLE_EQ(opt.momentum_buffer()[0], m0);
  EXPECT_DOUBLE_EQ(opt.momentum_buffer()[1], m1);
  EXPECT_EQ(opt.steps(), 3u);
}

TEST(OuterOptimizer, HeavyBallWithoutNesterov) {
  OuterOptimizer opt(OuterConfig{0.5, 0.5, false});
  std::vector<double> p = {0.0};
  std::vector<double> d = {1.0};
  opt.step(p.data(), d.data(), 1);  // m = -1, p = 0.5
  EXPECT_DOUBLE_EQ(p[0], 0.5);
  opt.step(p.data(), d.data(), 1);  // m = -1.5, p = 0.5 + 0.75
  EXPECT_DOUBLE_EQ(p[0], 1.25);
}

TEST(OuterOptimizer, PlainAveragingAddsTheMeanDelta) {
  // Local SGD: lr 1, no momentum: the new parameters are the mean of the workers'.
  OuterOptimizer opt(OuterConfig{1.0, 0.0, false});
  std::vector<double> p = {3.0, 4.0, -1.0};
  std::vector<double> d = {0.25, -0.5, 2.0};
  opt.step(p.data(), d.data(), 3);
  EXPECT_EQ(p, (std::vector<double>{3.25, 3.5, 1.0}));
  EXPECT_TRUE(opt.momentum_buffer().empty());  // no state kept without momentum
}

TEST(OuterOptimizer, RefusesBadSettingsNamingTheValue) {
  double nan = std::numeric_limits<double>::quiet_NaN();
  double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(outer_config_error(OuterConfig{0.7, 0.9, true}), "");
  EXPECT_EQ(outer_config_error(OuterConfig{1.0, 0.0, false}), "");
  EXPECT_NE(outer_config_error(OuterConfig{nan, 0.9, true}).find("outer learning rate nan"),
            std::string::npos);
  EXPECT_NE(outer_config_error(OuterConfig{-0.5, 0.9, true}).find("outer learning rate -0.5"),
            std::string::npos);
  EXPECT_NE(outer_config_error(OuterConfig{inf, 0.0, false}).find("outer learning rate inf"),
            std::string::npos);
  EXPECT_NE(outer_config_error(OuterConfig{0.7, 1.0, true}).find("outer momentum 1 "),
            std::string::npos);
  EXPECT_NE(outer_config_error(OuterConfig{0.7, -0.1, true}).find("outer momentum -0.1"),
            std::string::npos);
  EXPECT_NE(outer_config_error(OuterConfig{0.7, nan, true}).find("outer momentum nan"),
            std::string::npos);
  EXPECT_THROW(OuterOptimizer(OuterConfig{0.7, 1.5, false}), std::invalid_argument);
}

TEST(OuterOptimizer, ConvertsEveryFloatDtype) {
  std::vector<double> v = {1.5, -0.25, 1024.0};
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    ASSERT_TRUE(outer_dtype_ok(dt));
    std::vector<char> bytes(v.size() * dtype_size(dt));
    from_double(v.data(), v.size(), dt, bytes.data());
    std::vector<double> back(v.size());
    to_double(bytes.data(), dt, v.size(), back.data());
    EXPECT_EQ(back, v) << dtype_name(dt);  // all exact in every float type
    std::vector<double> acc = {1.0, 1.0, 1.0};
    add_as_double(bytes.data(), dt, v.size(), acc.data());
    EXPECT_EQ(acc, (std::vector<double>{2.5, 0.75, 1025.0})) << dtype_name(dt);
  }
  EXPECT_FALSE(outer_dtype_ok(DType::kInt32));
  std::vector<char> out(4);
  EXPECT_THROW(from_double(v.data(), 1, DType::kInt32, out.data()), std::invalid_argument);
}

TEST(OuterHeader, CheckWordCoversEveryField) {
  OuterHeader h{};
  h.magic = kOuterMagic;
  h.kind = kOuterInit;
  h.flags = kOuterNesterov;
  h.round = 3;
  h.lr = 0.7;
  h.momentum = 0.9;
  h.tensor = 0x1234567890abcdefull;
  h.part = 2;
  uint64_t base = outer_check(h);
  OuterHeader c = h;
  c.round = 4;
  EXPECT_NE(outer_check(c), base);
  c = h;
  c.lr = 0.70000001;
  EXPECT_NE(outer_check(c), base);
  c = h;
  c.part = 3;
  EXPECT_NE(outer_check(c), base);
  c = h;
  c.flags = 0;
  EXPECT_NE(outer_check(c), base);
  c = h;
  c.check = 12345;  // the check word itself is not mixed in
  EXPECT_EQ(outer_check(c), base);
}

TEST(OuterHeader, WireLenOnlyForAValidCompressedDelta) {
  std::vector<char> part(1000, 0);
  OuterHeader h{};
  h.magic = kOuterMagic;
  h.kind = kOuterDelta;
  h.flags = kOuterCompressed;
  h.tensor = 7;
  h.wire_len = 200;
  h.check = outer_check(h);
  std::memcpy(part.data(), &h, sizeof h);
  EXPECT_EQ(outer_wire_len(part.data(), part.size()), 200u);
  EXPECT_EQ(outer_wire_len(part.data(), 100), 100u);  // longer than the part: all of it
  OuterHeader c = h;
  c.flags = 0;  // an uncompressed delta
  c.check = outer_check(c);
  std::memcpy(part.data(), &c, sizeof c);
  EXPECT_EQ(outer_wire_len(part.data(), part.size()), 1000u);
  c = h;
  c.kind = kOuterInit;  // only deltas travel short
  c.check = outer_check(c);
  std::memcpy(part.data(), &c, sizeof c);
  EXPECT_EQ(outer_wire_len(part.data(), part.size()), 1000u);
  c = h;
  c.wire_len = 300;  // the check word no longer matches: not a header
  std::memcpy(part.data(), &c, sizeof c);
  EXPECT_EQ(outer_wire_len(part.data(), part.size()), 1000u);
  EXPECT_EQ(outer_wire_len(part.data(), 10), 10u);
}

// One outer part (tensor 77, part 0) of `count` float64 parameters on a store of n workers.
struct OuterPartFixture {
  static constexpr uint64_t kTensor = 77;
  uint32_t n;
  size_t count;
  DType dt;
  ParamStore store;
  std::vector<std::shared_ptr<RecordingConn>> conns;

  OuterPartFixture(uint32_t workers, size_t elems, DType dtype, uint32_t quorum, uint32_t history)
      : n(workers), count(elems), dt(dtype), store(workers, -1, 0, quorum, 0, history) {
    for (uint32_t r = 0; r < n; ++r) conns.push_back(std::make_shared<RecordingConn>(r));
  }
  size_t part_bytes() const { return sizeof(OuterHeader) + count * dtype_size(dt); }
  FrameHeader frame(uint32_t rank, uint16_t flags, size_t len) const {
    FrameHeader h{};
    h.magic = kFrameMagic;
    h.type = static_cast<uint8_t>(MsgType::kPush);
    h.dtype = static_cast<uint8_t>(dt);
    h.sender = rank;
    h.tensor = kTensor;
    h.part = 0;
    h.len = len;
    h.tensor_bytes = part_bytes();
    h.flags = flags;
    return h;
  }
  OuterHeader header(uint32_t kind, uint64_t round, double lr, uint32_t wire_len = 0) const {
    OuterHeader oh{};
    oh.magic = kOuterMagic;
    oh.kind = kind;
    oh.flags = wire_len ? kOuterCompressed : 0;
    oh.round = round;
    oh.lr = lr;
    oh.tensor = kTensor;
    oh.wire_len = wire_len;
    oh.check = outer_check(oh);
    return oh;
  }
  std::string push(uint32_t rank, uint16_t flags, const OuterHeader& oh, const char* body,
                   size_t body_len) {
    std::vector<char> bytes(sizeof oh + body_len);
    std::memcpy(bytes.data(), &oh, sizeof oh);
    std::memcpy(bytes.data() + sizeof oh, body, body_len);
    return store.handle(conns[rank], frame(rank, flags, bytes.size()),
                        Payload::memory(bytes.data(), bytes.size()));
  }
  void init(const std::vector<double>& v, double lr) {
    std::vector<char> body(count * dtype_size(dt));
    from_double(v.data(), count, dt, body.data());
    ASSERT_EQ(push(0, kFlagAsyncInit, header(kOuterInit, 0, lr), body.data(), body.size()), "");
    for (uint32_t r = 1; r < n; ++r) {
      FrameHeader h = frame(r, kFlagAsyncInit | kFlagNoData, part_bytes());
      ASSERT_EQ(store.handle(conns[r], h, Payload{}), "");
    }
  }
  std::string delta(uint32_t rank, uint64_t round, const std::vector<double>& d) {
    std::vector<char> body(count * dtype_size(dt));
    from_double(d.data(), count, dt, body.data());
    return push(rank, kFlagAsync, header(kOuterDelta, round, 1.0), body.data(), body.size());
  }
  // The parameters and round of the last answer `rank` got (its init's answer included).
  std::vector<double> answer(uint32_t rank, uint64_t* round = nullptr) const {
    const auto& c = *conns[rank];
    EXPECT_FALSE(c.payloads.empty());
    const std::string& p = c.payloads.back();
    EXPECT_EQ(c.frames.back().type, static_cast<uint8_t>(MsgType::kResult)) << p;
    EXPECT_EQ(p.size(), part_bytes());
    OuterHeader oh;
    std::memcpy(&oh, p.data(), sizeof oh);
    EXPECT_EQ(oh.kind, kOuterParams);
    if (round) *round = oh.round;
    std::vector<double> v(count);
    to_double(p.data() + sizeof oh, dt, count, v.data());
    return v;
  }
  size_t answers(uint32_t rank) const { return conns[rank]->frames.size(); }
};

TEST(OuterQuorum, ClosesWithTheFirstKDeltasAndAnswersALateOneFromHistory) {
  OuterPartFixture f(3, 4, DType::kFloat64, 2, 8);
  EXPECT_EQ(f.store.outer_needed(), 2u);
  std::vector<double> p = {1.0, -2.0, 0.5, 0.0};
  f.init(p, 1.0);  // plain averaging: params + mean(delta)
  std::vector<double> d0 = {0.25, 0.5, -1.0, 2.0}, d1 = {0.75, -0.5, 1.0, 4.0},
                      d2 = {100.0, 100.0, 100.0, 100.0};
  ASSERT_EQ(f.delta(0, 0, d0), "");
  EXPECT_EQ(f.answers(0), 1u);  // only its init's answer: the round waits for a second delta
  ASSERT_EQ(f.delta(1, 0, d1), "");
  // Closed with 2 of 3: the mean of those two (not their sum over 3).
  std::vector<double> want = {1.5, -2.0, 0.5, 3.0};
  uint64_t rnd = 0;
  EXPECT_EQ(f.answer(0, &rnd), want);
  EXPECT_EQ(rnd, 1u);
  EXPECT_EQ(f.answer(1), want);
  EXPECT_EQ(f.store.outer_steps(), 1u);
  // Worker 2's delta of round 0 arrives late: dropped, answered with the same bytes.
  ASSERT_EQ(f.delta(2, 0, d2), "");
  EXPECT_EQ(f.conns[2]->payloads.back(), f.conns[0]->payloads.back());
  EXPECT_EQ(f.answer(2, &rnd), want);
  EXPECT_EQ(rnd, 1u);
  EXPECT_EQ(f.store.late_outer(), 1u);
  EXPECT_EQ(f.store.outer_steps(), 1u);
  // Round 1: worker 2 is first in and counts; worker 0 closes it; worker 1 is late.
  ASSERT_EQ(f.delta(2, 1, d0), "");
  ASSERT_EQ(f.delta(0, 1, d1), "");
  std::vector<double> want1 = {2.0, -2.0, 0.5, 6.0};
  EXPECT_EQ(f.answer(2, &rnd), want1);
  EXPECT_EQ(rnd, 2u);
  ASSERT_EQ(f.delta(1, 1, d2), "");
  EXPECT_EQ(f.answer(1), want1);
  EXPECT_EQ(f.store.late_outer(), 2u);
  // A delta of a round not reached yet is still refused, naming both rounds.
  std::string bad = f.delta(1, 5, d0);
  EXPECT_NE(bad.find("outer round 5"), std::string::npos) << bad;
  EXPECT_NE(bad.find("in round 2"), std::string::npos) << bad;
}

TEST(OuterQuorum, WithoutAQuorumALateDeltaIsRefused) {
  OuterPartFixture f(2, 2, DType::kFloat32, 0, 8);
  EXPECT_EQ(f.store.outer_needed(), 2u);
  f.init({1.0, 2.0}, 1.0);
  ASSERT_EQ(f.delta(0, 0, {1.0, 1.0}), "");
  EXPECT_EQ(f.answers(0), 1u);
  ASSERT_EQ(f.delta(1, 0, {3.0, 3.0}), "");
  EXPECT_EQ(f.answer(0), (std::vector<double>{3.0, 4.0}));
  std::string bad = f.delta(1, 0, {3.0, 3.0});
  EXPECT_NE(bad.find("outer round 0"), std::string::npos) << bad;
  EXPECT_NE(bad.find("in round 1"), std::string::npos) << bad;
}

TEST(OuterQuorum, LagBoundWaitsUntilTheLateWorkerIsWithinHistory) {
  // History 1: a round may close early only while every worker's next round is the open
  // one or the one just kept.
  OuterPartFixture f(3, 1, DType::kFloat64, 2, 1);
  f.init({0.0}, 1.0);
  ASSERT_EQ(f.delta(0, 0, {1.0}), "");
  ASSERT_EQ(f.delta(1, 0, {3.0}), "");  // round 0 closes (worker 2 may still fetch it)
  EXPECT_EQ(f.answer(0), (std::vector<double>{2.0}));
  ASSERT_EQ(f.delta(0, 1, {2.0}), "");
  ASSERT_EQ(f.delta(1, 1, {4.0}), "");
  // Closing round 1 now would evict round 0, which worker 2 has not fetched: it waits.
  EXPECT_EQ(f.answers(0), 2u);
  EXPECT_EQ(f.store.outer_steps(), 1u);
  // Worker 2's late delta of round 0 is answered from history, and round 1 closes with
  // the two deltas in.
  ASSERT_EQ(f.delta(2, 0, {50.0}), "");
  EXPECT_EQ(f.answer(2), (std::vector<double>{2.0}));
  EXPECT_EQ(f.store.outer_steps(), 2u);
  EXPECT_EQ(f.answer(0), (std::vector<double>{5.0}));
  EXPECT_EQ(f.answer(1), (std::vector<double>{5.0}));
  // Its delta of round 1 is late too and gets round 1's answer.
  ASSERT_EQ(f.delta(2, 1, {50.0}), "");
  EXPECT_EQ(f.answer(2), (std::vector<double>{5.0}));
  // Round 0 is gone from the history (1 kept): a delta of it is refused, to its sender only.
  std::string bad = f.delta(2, 0, {1.0});
  EXPECT_NE(bad.find("late"), std::string::npos) << bad;
  EXPECT_NE(bad.find("FASTPS_QUORUM_HISTORY"), std::string::npos) << bad;
}

TEST(OuterCompressed, DecodesAnFp16DeltaAndMixesWithAPlainOne) {
  const size_t count = 33;  // the compressed form must be shorter than the part
  OuterPartFixture f(2, count, DType::kFloat32, 0, 8);
  std::vector<double> p(count), d1(count, 0.5);
  std::vector<float> d0(count);
  for (size_t i = 0; i < count; ++i) {
    p[i] = 1.0 + i;
    d0[i] = 0.1f * static_cast<float>(i) - 1.3f;  // most not representable in fp16
  }
  f.init(p, 1.0);
  CompressionSpec spec = CompressionSpec::parse("fp16");
  auto enc = encode_part(spec, d0.data(), DType::kFloat32, count, 0, nullptr, 0);
  ASSERT_EQ(enc->size(), compressed_bytes(spec, count));
  size_t wire = (sizeof(OuterHeader) + enc->size() + 3) / 4 * 4;  // whole float32 elements
  std::vector<char> body(wire - sizeof(OuterHeader), 0);
  std::memcpy(body.data(), enc->data(), enc->size());
  OuterHeader oh = f.header(kOuterDelta, 0, 1.0, static_cast<uint32_t>(wire));
  ASSERT_EQ(f.push(0, kFlagAsync, oh, body.data(), body.size()), "");
  EXPECT_EQ(f.store.compressed_deltas(), 1u);
  ASSERT_EQ(f.delta(1, 0, d1), "");
  std::vector<double> got = f.answer(0);
  int rounded = 0;
  for (size_t i = 0; i < count; ++i) {
    rounded += half::fp16_to_float(half::float_to_fp16(d0[i])) != d0[i];
    double q = half::fp16_to_float(half::float_to_fp16(d0[i]));  // the codec's rounding
    double want = static_cast<float>(p[i] + (q + d1[i]) / 2);
    EXPECT_EQ(got[i], want) << i;
  }
  EXPECT_GT(rounded, 20);  // the reference did round
  // A compressed delta whose header names another length is refused, naming both.
  OuterHeader lie = f.header(kOuterDelta, 1, 1.0, static_cast<uint32_t>(wire + 4));
  std::string bad = f.push(0, kFlagAsync, lie, body.data(), body.size());
  EXPECT_NE(bad.find("compressed outer delta"), std::string::npos) << bad;
  EXPECT_NE(bad.find(std::to_string(wire + 4)), std::string::npos) << bad;
  // ... and one whose body is not a compressed part.
  std::vector<char> junk(body.size(), 'x');
  bad = f.push(1, kFlagAsync, f.header(kOuterDelta, 1, 1.0, static_cast<uint32_t>(wire)),
               junk.data(), junk.size());
  EXPECT_NE(bad.find("compressed outer delta"), std::string::npos) << bad;
}

}  // namespace
}  // namespace fastps
