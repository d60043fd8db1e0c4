// The partitioner is a pure function every worker must compute identically.
#include <gtest/gtest.h>

#include <numeric>
#include <stdexcept>

#include "worker/partitioner.h"
#include "worker/registry.h"

namespace fastps {
namespace {

// Parts tile [0, nbytes) in order, whole elements each, none over the part size.
void expect_tiling(const std::vector<PartSpan>& parts, size_t nbytes, size_t elem,
                   size_t part_bytes, size_t servers) {
  size_t off = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    EXPECT_EQ(parts[i].index, i);
    EXPECT_EQ(parts[i].offset, off);
    EXPECT_GT(parts[i].len, 0u);
    EXPECT_LE(parts[i].len, std::max(elem, part_bytes));
    EXPECT_EQ(parts[i].len % elem, 0u);
    EXPECT_EQ(parts[i].offset % elem, 0u);
    EXPECT_LT(parts[i].server, servers);
    off += parts[i].len;
  }
  EXPECT_EQ(off, nbytes);
}

bool same(const std::vector<PartSpan>& a, const std::vector<PartSpan>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].index != b[i].index || a[i].offset != b[i].offset || a[i].len != b[i].len ||
        a[i].server != b[i].server)
      return false;
  return true;
}

TEST(Partitioner, SameInputsGiveTheSameParts) {
  std::vector<double> w = {1.0, 2.5, 0.5};
  Partitioner a(256 << 10, w), b(256 << 10, w);
  for (const char* name : {"fc.weight", "conv1.bias", "embedding"}) {
    for (size_t n : {size_t(4), size_t(1000), size_t(300000), size_t(5u << 20) + 12}) {
      auto pa = a.split(tensor_id_of(name), n, 4);
      EXPECT_TRUE(same(pa, b.split(tensor_id_of(name), n, 4))) << name << " " << n;
      EXPECT_TRUE(same(pa, a.split(tensor_id_of(name), n, 4))) << name << " " << n;
      expect_tiling(pa, n, 4, 256 << 10, w.size());
    }
  }
}

TEST(Partitioner, EmptyTensorHasNoParts) {
  Partitioner p(1024, {1.0});
  EXPECT_TRUE(p.split(42, 0, 4).empty());
}

TEST(Partitioner, LargeTensorsAreSlicedInProportionToWeights) {
  std::vector<double> w = {1.0, 2.0, 3.0, 0.0};
  Partitioner p(64 << 10, w);
  for (size_t elem : {size_t(2), size_t(4), size_t(8)}) {
    size_t nbytes = (12u << 20) + 6 * elem;
    for (uint64_t id : {tensor_id_of("a"), tensor_id_of("b"), uint64_t(0), ~uint64_t(0)}) {
      auto parts = p.split(id, nbytes, elem);
      expect_tiling(parts, nbytes, elem, 64 << 10, w.size());
      std::vector<size_t> bytes(w.size(), 0);
      for (auto& s : parts) bytes[s.server] += s.len;
      double total = std::accumulate(w.begin(), w.end(), 0.0);
      for (size_t s = 0; s < w.size(); ++s) {
        double want = static_cast<double>(nbytes) * w[s] / total;
        EXPECT_NEAR(static_cast<double>(bytes[s]), want, static_cast<double>(elem))
            << "server " << s << ", elem " << elem << ", id " << id;
      }
      EXPECT_EQ(bytes[3], 0u);  // weight 0: nothing
    }
  }
}

TEST(Partitioner, SmallTensorsGoWholeToOneServer) {
  Partitioner p(1 << 20, {1.0, 1.0, 1.0});
  size_t small = p.slice_threshold() - 4;
  std::vector<int> used(3, 0);
  for (int i = 0; i < 300; ++i) {
    auto parts = p.split(tensor_id_of("t" + std::to_string(i)), small, 4);
    ASSERT_EQ(parts.size(), 1u);
    used[parts[0].server]++;
  }
  // Many small tensors spread over every server.
  for (int s = 0; s < 3; ++s) EXPECT_GT(used[s], 50) << "server " << s;
}

TEST(Partitioner, PatternFollowsWeights) {
  std::vector<double> w = {1.0, 4.0, 5.0};
  Partitioner p(1024, w);
  std::vector<size_t> count(3, 0);
  for (uint32_t s : p.pattern()) count[s]++;
  for (size_t s = 0; s < 3; ++s)
    EXPECT_NEAR(static_cast<double>(count[s]) / p.pattern().size(), w[s] / 10.0, 0.01);
}

TEST(Partitioner, RejectsBadSettings) {
  EXPECT_THROW(Partitioner(0, {1.0}), std::invalid_argument);
  EXPECT_THROW(Partitioner(1024, {1.0, -1.0}), std::invalid_argument);
  EXPECT_THROW(Partitioner(1024, {0.0, 0.0}), std::invalid_argument);
}

}  // namespace
}  // namespace fastps
