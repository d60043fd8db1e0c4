// Every kernel variant this CPU runs (AVX-512, AVX2, scalar) against a plain
// reference written here, for every dtype, at sizes with and without SIMD tails.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/sum.h"

namespace fastps {
namespace {

// ---- reference arithmetic, independent of kernels/half.h ----

// IEEE binary16 through the compiler's _Float16 (round to nearest even).
uint16_t ref_to_fp16(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
float ref_from_fp16(uint16_t u) {
  _Float16 h;
  std::memcpy(&h, &u, 2);
  return static_cast<float>(h);
}
// bfloat16: 8 significant bits, rounded to nearest even (finite normal inputs).
float ref_from_bf16(uint16_t u) {
  uint32_t b = static_cast<uint32_t>(u) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint16_t ref_to_bf16(float f) {
  if (f == 0) return std::signbit(f) ? 0x8000 : 0;
  int e;
  double m = std::frexp(static_cast<double>(f), &e);  // f = m * 2^e, 0.5 <= |m| < 1
  double r = std::nearbyint(std::ldexp(m, 8));        // ties to even (default mode)
  float g = static_cast<float>(std::ldexp(r, e - 8));
  uint32_t b;
  std::memcpy(&b, &g, 4);
  return static_cast<uint16_t>(b >> 16);
}

template <typename T>
T wrap_add(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}

template <typename T>
T sat_scale(T x, double f) {
  double v = std::trunc(static_cast<double>(x) * f);
  if (std::isnan(v)) return 0;
  if (v <= static_cast<double>(std::numeric_limits<T>::min())) return std::numeric_limits<T>::min();
  if (v >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
  return static_cast<T>(v);
}

// ---- random inputs per dtype, as raw bytes ----

std::vector<uint8_t> random_bytes(DType dt, size_t n, std::mt19937* rng) {
  std::vector<uint8_t> out(n * dtype_size(dt));
  std::uniform_real_distribution<float> real(-100.0f, 100.0f);
  for (size_t i = 0; i < n; ++i) {
    uint8_t* p = out.data() + i * dtype_size(dt);
    switch (dt) {
      case DType::kFloat32: {
        float v = real(*rng);
        std::memcpy(p, &v, 4);
        break;
      }
      case DType::kFloat64: {
        double v = real(*rng) * 1.000001;
        std::memcpy(p, &v, 8);
        break;
      }
      case DType::kFloat16: {
        uint16_t v = ref_to_fp16(real(*rng));
        std::memcpy(p, &v, 2);
        break;
      }
      case DType::kBFloat16: {
        uint16_t v = ref_to_bf16(real(*rng));
        std::memcpy(p, &v, 2);
        break;
      }
      case DType::kBool:
        *p = (*rng)() % 2;
        break;
      default:  // integers: any bit pattern, so sums overflow and wrap
        for (size_t b = 0; b < dtype_size(dt); ++b) p[b] = static_cast<uint8_t>((*rng)());
    }
  }
  return out;
}

template <typename T>
T at(const std::vector<uint8_t>& v, size_t i) {
  T x;
  std::memcpy(&x, v.data() + i * sizeof(T), sizeof(T));
  return x;
}

// The reference sum of element i as the bytes the kernel must produce.
std::vector<uint8_t> ref_sum(DType dt, const std::vector<uint8_t>& a, const std::vector<uint8_t>& b,
                             size_t n) {
  std::vector<uint8_t> out(a.size());
  for (size_t i = 0; i < n; ++i) {
    uint8_t* p = out.data() + i * dtype_size(dt);
    switch (dt) {
      case DType::kFloat32: {
        float v = at<float>(a, i) + at<float>(b, i);
        std::memcpy(p, &v, 4);
        break;
      }
      case DType::kFloat64: {
        double v = at<double>(a, i) + at<double>(b, i);
        std::memcpy(p, &v, 8);
        break;
      }
      case DType::kFloat16: {
        uint16_t v =
            ref_to_fp16(ref_from_fp16(at<uint16_t>(a, i)) + ref_from_fp16(at<uint16_t>(b, i)));
        std::memcpy(p, &v, 2);
        break;
      }
      case DType::kBFloat16: {
        uint16_t v =
            ref_to_bf16(ref_from_bf16(at<uint16_t>(a, i)) + ref_from_bf16(at<uint16_t>(b, i)));
        std::memcpy(p, &v, 2);
        break;
      }
      case DType::kInt32: {
        int32_t v = wrap_add(at<int32_t>(a, i), at<int32_t>(b, i));
        std::memcpy(p, &v, 4);
        break;
      }
      case DType::kInt64: {
        int64_t v = wrap_add(at<int64_t>(a, i), at<int64_t>(b, i));
        std::memcpy(p, &v, 8);
        break;
      }
      case DType::kUInt8:
        *p = static_cast<uint8_t>(a[i] + b[i]);
        break;
      case DType::kInt8: {
        int8_t v = wrap_add(at<int8_t>(a, i), at<int8_t>(b, i));
        std::memcpy(p, &v, 1);
        break;
      }
      case DType::kInt16: {
        int16_t v = wrap_add(at<int16_t>(a, i), at<int16_t>(b, i));
        std::memcpy(p, &v, 2);
        break;
      }
      case DType::kBool:
        *p = (a[i] | b[i]) ? 1 : 0;
        break;
      default:
        ADD_FAILURE() << "dtype " << static_cast<int>(dt);
    }
  }
  return out;
}

std::vector<uint8_t> ref_scale(DType dt, const std::vector<uint8_t>& a, size_t n, double f) {
  std::vector<uint8_t> out(a.size());
  float ff = static_cast<float>(f);
  for (size_t i = 0; i < n; ++i) {
    uint8_t* p = out.data() + i * dtype_size(dt);
    switch (dt) {
      case DType::kFloat32: {
        float v = at<float>(a, i) * ff;
        std::memcpy(p, &v, 4);
        break;
      }
      case DType::kFloat64: {
        double v = at<double>(a, i) * f;
        std::memcpy(p, &v, 8);
        break;
      }
      case DType::kFloat16: {
        uint16_t v = ref_to_fp16(ref_from_fp16(at<uint16_t>(a, i)) * ff);
        std::memcpy(p, &v, 2);
        break;
      }
      case DType::kBFloat16: {
        uint16_t v = ref_to_bf16(ref_from_bf16(at<uint16_t>(a, i)) * ff);
        std::memcpy(p, &v, 2);
        break;
      }
      case DType::kInt32: {
        int32_t v = sat_scale(at<int32_t>(a, i), f);
        std::memcpy(p, &v, 4);
        break;
      }
      case DType::kInt64: {
        int64_t v = sat_scale(at<int64_t>(a, i), f);
        std::memcpy(p, &v, 8);
        break;
      }
      case DType::kUInt8:
        *p = sat_scale(a[i], f);
        break;
      case DType::kInt8: {
        int8_t v = sat_scale(at<int8_t>(a, i), f);
        std::memcpy(p, &v, 1);
        break;
      }
      case DType::kInt16: {
        int16_t v = sat_scale(at<int16_t>(a, i), f);
        std::memcpy(p, &v, 2);
        break;
      }
      case DType::kBool:
        *p = a[i];
        break;
      default:
        ADD_FAILURE() << "dtype " << static_cast<int>(dt);
    }
  }
  return out;
}

// First differing element, or -1.
long first_diff(const std::vector<uint8_t>& x, const std::vector<uint8_t>& y, size_t elem) {
  for (size_t i = 0; i < x.size(); i += elem)
    if (std::memcmp(x.data() + i, y.data() + i, elem) != 0) return static_cast<long>(i / elem);
  return -1;
}

class Kernels : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  void SetUp() override {
    level_ = std::get<0>(GetParam());
    previous_ = simd_level();
    if (!set_simd_level(level_.c_str())) GTEST_SKIP() << "this CPU lacks " << level_;
  }
  void TearDown() override { set_simd_level(previous_.c_str()); }
  DType dtype() const { return static_cast<DType>(std::get<1>(GetParam())); }
  std::string level_, previous_;
};

const size_t kSizes[] = {0, 1, 3, 7, 8, 15, 16, 17, 31, 33, 64, 127, 1000, 4099, 70001};

TEST_P(Kernels, SumIntoMatchesReference) {
  DType dt = dtype();
  std::mt19937 rng(static_cast<uint32_t>(dt) * 31 + 7);
  for (size_t n : kSizes) {
    auto a = random_bytes(dt, n, &rng), b = random_bytes(dt, n, &rng);
    auto want = ref_sum(dt, a, b, n);
    auto got = a;
    sum_into(got.data(), b.data(), n, dt);
    EXPECT_EQ(first_diff(got, want, dtype_size(dt)), -1)
        << dtype_name(dt) << " n=" << n << " on " << level_;
  }
}

TEST_P(Kernels, SumToMatchesReferenceAndMayAlias) {
  DType dt = dtype();
  std::mt19937 rng(static_cast<uint32_t>(dt) * 17 + 3);
  for (size_t n : kSizes) {
    auto a = random_bytes(dt, n, &rng), b = random_bytes(dt, n, &rng);
    auto want = ref_sum(dt, a, b, n);
    std::vector<uint8_t> got(a.size());
    sum_to(got.data(), a.data(), b.data(), n, dt);
    EXPECT_EQ(first_diff(got, want, dtype_size(dt)), -1) << dtype_name(dt) << " n=" << n;
    auto alias = b;  // dst == b
    sum_to(alias.data(), a.data(), alias.data(), n, dt);
    EXPECT_EQ(first_diff(alias, want, dtype_size(dt)), -1) << dtype_name(dt) << " n=" << n;
  }
}

TEST_P(Kernels, ScaleMatchesReference) {
  DType dt = dtype();
  std::mt19937 rng(static_cast<uint32_t>(dt) * 13 + 1);
  for (double f : {0.25, 1.0 / 3.0, -2.0, 1e10}) {
    for (size_t n : kSizes) {
      auto a = random_bytes(dt, n, &rng);
      if (dt == DType::kFloat16 && std::fabs(f) > 100) continue;  // inf is not the point here
      if ((dt == DType::kFloat32 || dt == DType::kBFloat16) && std::fabs(f) > 1e6) continue;
      auto want = ref_scale(dt, a, n, f);
      auto got = a;
      scale(got.data(), n, dt, f);
      EXPECT_EQ(first_diff(got, want, dtype_size(dt)), -1)
          << dtype_name(dt) << " n=" << n << " factor " << f << " on " << level_;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, Kernels,
                         ::testing::Combine(::testing::Values("scalar", "avx2", "avx512"),
                                            ::testing::Range(0, static_cast<int>(DType::kCount))),
                         [](const ::testing::TestParamInfo<Kernels::ParamType>& info) {
                           return std::get<0>(info.param) + "_" +
                                  dtype_name(static_cast<DType>(std::get<1>(info.param)));
                         });

TEST(KernelsDispatch, RejectsUnknownLevel) {
  std::string before = simd_level();
  EXPECT_FALSE(set_simd_level("sse9"));
  EXPECT_EQ(before, simd_level());
}

}  // namespace
}  // namespace fastps
