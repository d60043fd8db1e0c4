// The servers' outer optimizer (server/outer_optimizer.h): the update rule against steps
// computed by hand in float64, its checks, the dtype conversions, and the in-band header's
// check word (protocol/messages.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "protocol/messages.h"
#include "server/outer_optimizer.h"

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

}  // namespace
}  // namespace fastps
