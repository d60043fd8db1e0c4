// Reduction kernels: element-wise sum and scale for every DType, in three
// variants compiled into the same object (scalar, AVX2+F16C, AVX-512F/BW).
// The SIMD variants are compiled per function with target attributes, so the
// build itself assumes nothing beyond baseline x86-64; the variant is picked
// once at run time from what the CPU reports.
//
// Conventions shared by all variants (the scalar ops below are the reference):
//   * float16 / bfloat16 are widened to float32, added (or multiplied), and
//     rounded back to nearest-even; NaN stays NaN, overflow gives infinity.
//   * integers wrap on overflow (two's complement), like numpy.
//   * bool sums as logical OR and always writes 0 or 1.
//   * pointers may have any alignment, even one that is not a multiple of
//     the element size; every load and store is unaligned-safe.
//   * large sum_to calls into a separate destination write it with
//     non-temporal stores (see kStreamMinBytes).
#include "kernels/sum.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/half.h"

#if defined(__x86_64__) || defined(__i386__)
#define FASTPS_X86 1
// GCC 12 and older report false (maybe-)uninitialized warnings from inside
// the AVX-512 intrinsic headers (the "__Y = __Y" undefined-vector idiom) once
// they are inlined; silence them for the header's lines only.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
#else
#define FASTPS_X86 0
#endif

namespace fastps {
namespace {

constexpr size_t kNumTypes = static_cast<size_t>(DType::kCount);

// sum_to writes destinations at least this large with streaming
// (non-temporal) stores when the destination is a separate buffer: the three
// buffers no longer fit in this core's share of the last-level cache, and a
// streaming store saves the read-for-ownership of every destination line
// (3 instead of 4 bytes of traffic per output byte). Below it the result (a
// PHub/BytePS-sized chunk) is likely to be reread from cache soon, and
// ordinary stores are faster (measured on one AVX-512 core, float32, 3 x bytes:
// 12 MiB buffers 26 GB/s ordinary vs 18 streaming; 64 MiB 16 vs 20). In-place sums
// (dst == a or b, as in sum_into) have just read the destination line, so
// there is no read-for-ownership to save; they always use ordinary stores.
constexpr size_t kStreamMinBytes = size_t{16} << 20;

inline bool use_streaming(const void* d, const void* a, const void* b, size_t bytes, size_t elem,
                          size_t block) {
  const size_t mis = reinterpret_cast<uintptr_t>(d) & (block - 1);
  return bytes >= kStreamMinBytes && d != a && d != b && mis % elem == 0;
}

// ---------------------------------------------------------------------------
// Scalar reference ops. Each has T (storage type), S (the scale factor in the
// type scaling is computed in), add, mul and factor.
// ---------------------------------------------------------------------------

template <typename T>
inline T ld(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
inline void st(char* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

struct F32Op {
  using T = float;
  using S = float;
  static S factor(double f) { return static_cast<float>(f); }
  static T add(T a, T b) { return a + b; }
  static T mul(T x, S f) { return x * f; }
};

struct F64Op {
  using T = double;
  using S = double;
  static S factor(double f) { return f; }
  static T add(T a, T b) { return a + b; }
  static T mul(T x, S f) { return x * f; }
};

struct F16Op {
  using T = uint16_t;
  using S = float;
  static S factor(double f) { return static_cast<float>(f); }
  static T add(T a, T b) {
    return half::float_to_fp16(half::fp16_to_float(a) + half::fp16_to_float(b));
  }
  static T mul(T x, S f) { return half::float_to_fp16(half::fp16_to_float(x) * f); }
};

struct BF16Op {
  using T = uint16_t;
  using S = float;
  static S factor(double f) { return static_cast<float>(f); }
  static T add(T a, T b) {
    return half::float_to_bf16(half::bf16_to_float(a) + half::bf16_to_float(b));
  }
  static T mul(T x, S f) { return half::float_to_bf16(half::bf16_to_float(x) * f); }
};

template <typename I>
struct IntOp {
  using T = I;
  using S = double;
  using U = std::make_unsigned_t<I>;
  static S factor(double f) { return f; }
  // Unsigned arithmetic: wraps without signed-overflow UB.
  static T add(T a, T b) {
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  }
  // trunc(x * f) in double, saturated to the type's range; NaN gives 0.
  static T mul(T x, S f) {
    const double v = std::trunc(static_cast<double>(x) * f);
    if (std::isnan(v)) return 0;
    constexpr T lo = std::numeric_limits<T>::min();
    constexpr T hi = std::numeric_limits<T>::max();
    if (v <= static_cast<double>(lo)) return lo;
    if (v >= static_cast<double>(hi)) return hi;
    return static_cast<T>(v);
  }
};

struct BoolOp {
  using T = uint8_t;
  using S = double;
  static S factor(double f) { return f; }
  static T add(T a, T b) { return (a | b) != 0 ? 1 : 0; }
  static T mul(T x, S) { return x; }
};

template <class Op>
inline void scalar_sum_range(char* d, const char* a, const char* b, size_t n) {
  using T = typename Op::T;
  for (size_t i = 0; i < n; ++i) {
    const size_t o = i * sizeof(T);
    st<T>(d + o, Op::add(ld<T>(a + o), ld<T>(b + o)));
  }
}

template <class Op>
inline void scalar_scale_range(char* d, size_t n, typename Op::S f) {
  using T = typename Op::T;
  for (size_t i = 0; i < n; ++i) {
    const size_t o = i * sizeof(T);
    st<T>(d + o, Op::mul(ld<T>(d + o), f));
  }
}

template <class Op>
void scalar_sum(void* d, const void* a, const void* b, size_t n) {
  scalar_sum_range<Op>(static_cast<char*>(d), static_cast<const char*>(a),
                       static_cast<const char*>(b), n);
}

template <class Op>
void scalar_scale(void* d, size_t n, double f) {
  scalar_scale_range<Op>(static_cast<char*>(d), n, Op::factor(f));
}

void scale_noop(void*, size_t, double) {}

using SumFn = void (*)(void* dst, const void* a, const void* b, size_t n);
using ScaleFn = void (*)(void* dst, size_t n, double factor);

struct KernelSet {
  const char* name;
  SumFn sum[kNumTypes];
  ScaleFn scale[kNumTypes];
};

static_assert(static_cast<int>(DType::kFloat32) == 0 && static_cast<int>(DType::kFloat64) == 1 &&
                  static_cast<int>(DType::kFloat16) == 2 &&
                  static_cast<int>(DType::kBFloat16) == 3 && static_cast<int>(DType::kInt32) == 4 &&
                  static_cast<int>(DType::kInt64) == 5 && static_cast<int>(DType::kUInt8) == 6 &&
                  static_cast<int>(DType::kInt8) == 7 && static_cast<int>(DType::kInt16) == 8 &&
                  static_cast<int>(DType::kBool) == 9,
              "kernel tables below are written in DType order");

const KernelSet kScalarSet = {
    "scalar",
    {scalar_sum<F32Op>, scalar_sum<F64Op>, scalar_sum<F16Op>, scalar_sum<BF16Op>,
     scalar_sum<IntOp<int32_t>>, scalar_sum<IntOp<int64_t>>, scalar_sum<IntOp<uint8_t>>,
     scalar_sum<IntOp<int8_t>>, scalar_sum<IntOp<int16_t>>, scalar_sum<BoolOp>},
    {scalar_scale<F32Op>, scalar_scale<F64Op>, scalar_scale<F16Op>, scalar_scale<BF16Op>,
     scalar_scale<IntOp<int32_t>>, scalar_scale<IntOp<int64_t>>, scalar_scale<IntOp<uint8_t>>,
     scalar_scale<IntOp<int8_t>>, scalar_scale<IntOp<int16_t>>, scale_noop},
};

#if FASTPS_X86

// ---------------------------------------------------------------------------
// AVX2 (+F16C). A kernel struct K describes one 32-byte block:
//   V load(p), store(p, v), stream(p, v) (p 32-byte aligned), add(x, y),
//   and for float types SV factor(double), mul(v, SV).
// Tails shorter than a block use the scalar op.
// ---------------------------------------------------------------------------

#define FASTPS_AVX2 __attribute__((target("avx2,f16c")))

// kBf16NanNote: the SIMD bfloat16 paths round with (u + 0x7fff + lsb) >> 16
// and no NaN test. That add could carry a NaN into another value only if the
// low 16 bits of the float32 NaN were nonzero. They never are: every operand
// is a widened bfloat16 (low 16 bits zero), and an x86 add/mul returns either
// one of its NaN operands (quieted, payload kept) or the default NaN
// 0xffc00000. The one other float that enters is the scale factor, whose NaN
// payload comes from a double; bf16_safe_factor replaces such a NaN with the
// default quiet NaN, so its low 16 bits are zero too.
inline float bf16_safe_factor(double f) {
  const float ff = static_cast<float>(f);
  return std::isnan(ff) ? std::numeric_limits<float>::quiet_NaN() : ff;
}

struct Avx2F32 {
  using Op = F32Op;
  using V = __m256;
  using SV = __m256;
  static constexpr size_t kLanes = 8;
  FASTPS_AVX2 static V load(const char* p) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  }
  FASTPS_AVX2 static void store(char* p, V v) { _mm256_storeu_ps(reinterpret_cast<float*>(p), v); }
  FASTPS_AVX2 static void stream(char* p, V v) { _mm256_stream_ps(reinterpret_cast<float*>(p), v); }
  FASTPS_AVX2 static V add(V x, V y) { return _mm256_add_ps(x, y); }
  FASTPS_AVX2 static SV factor(double f) { return _mm256_set1_ps(static_cast<float>(f)); }
  FASTPS_AVX2 static V mul(V x, SV f) { return _mm256_mul_ps(x, f); }
};

struct Avx2F64 {
  using Op = F64Op;
  using V = __m256d;
  using SV = __m256d;
  static constexpr size_t kLanes = 4;
  FASTPS_AVX2 static V load(const char* p) {
    return _mm256_loadu_pd(reinterpret_cast<const double*>(p));
  }
  FASTPS_AVX2 static void store(char* p, V v) { _mm256_storeu_pd(reinterpret_cast<double*>(p), v); }
  FASTPS_AVX2 static void stream(char* p, V v) {
    _mm256_stream_pd(reinterpret_cast<double*>(p), v);
  }
  FASTPS_AVX2 static V add(V x, V y) { return _mm256_add_pd(x, y); }
  FASTPS_AVX2 static SV factor(double f) { return _mm256_set1_pd(f); }
  FASTPS_AVX2 static V mul(V x, SV f) { return _mm256_mul_pd(x, f); }
};

// 16 half-precision values held as two float32 vectors.
struct Avx2F32x2 {
  __m256 lo, hi;
};

struct Avx2F16 {
  using Op = F16Op;
  using V = Avx2F32x2;
  using SV = __m256;
  static constexpr size_t kLanes = 16;
  FASTPS_AVX2 static V load(const char* p) {
    const __m128i* q = reinterpret_cast<const __m128i*>(p);
    return {_mm256_cvtph_ps(_mm_loadu_si128(q)), _mm256_cvtph_ps(_mm_loadu_si128(q + 1))};
  }
  FASTPS_AVX2 static __m256i narrow(V v) {
    const __m128i lo = _mm256_cvtps_ph(v.lo, _MM_FROUND_TO_NEAREST_INT);
    const __m128i hi = _mm256_cvtps_ph(v.hi, _MM_FROUND_TO_NEAREST_INT);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
  }
  FASTPS_AVX2 static void store(char* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), narrow(v));
  }
  FASTPS_AVX2 static void stream(char* p, V v) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), narrow(v));
  }
  FASTPS_AVX2 static V add(V x, V y) {
    return {_mm256_add_ps(x.lo, y.lo), _mm256_add_ps(x.hi, y.hi)};
  }
  FASTPS_AVX2 static SV factor(double f) { return _mm256_set1_ps(static_cast<float>(f)); }
  FASTPS_AVX2 static V mul(V x, SV f) { return {_mm256_mul_ps(x.lo, f), _mm256_mul_ps(x.hi, f)}; }
};

// bfloat16 is the top half of a float32, so widening interleaves zero words
// below each value. unpacklo/unpackhi and packus all work within 128-bit
// lanes and are inverses of each other, so the element order the two float
// vectors hold (0-3 8-11 | 4-7 12-15) is restored on the way back without a
// cross-lane permute; all arithmetic in between is element-wise.
struct Avx2BF16 {
  using Op = BF16Op;
  using V = Avx2F32x2;
  using SV = __m256;
  static constexpr size_t kLanes = 16;
  FASTPS_AVX2 static V load(const char* p) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i zero = _mm256_setzero_si256();
    return {_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v)),
            _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v))};
  }
  // float32 -> bfloat16 bits (round to nearest even) in the low half of each
  // 32-bit lane. No NaN special case is needed here: see kBf16NanNote.
  FASTPS_AVX2 static __m256i round(__m256 f) {
    const __m256i u = _mm256_castps_si256(f);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff));
    return _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  }
  // Lanes hold values <= 0xffff, so the signed-to-unsigned saturation of
  // packus never triggers.
  FASTPS_AVX2 static __m256i narrow(V v) { return _mm256_packus_epi32(round(v.lo), round(v.hi)); }
  FASTPS_AVX2 static void store(char* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), narrow(v));
  }
  FASTPS_AVX2 static void stream(char* p, V v) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), narrow(v));
  }
  FASTPS_AVX2 static V add(V x, V y) {
    return {_mm256_add_ps(x.lo, y.lo), _mm256_add_ps(x.hi, y.hi)};
  }
  FASTPS_AVX2 static SV factor(double f) { return _mm256_set1_ps(bf16_safe_factor(f)); }
  FASTPS_AVX2 static V mul(V x, SV f) { return {_mm256_mul_ps(x.lo, f), _mm256_mul_ps(x.hi, f)}; }
};

template <typename I>
struct Avx2Int {
  using Op = IntOp<I>;
  using V = __m256i;
  static constexpr size_t kLanes = 32 / sizeof(I);
  FASTPS_AVX2 static V load(const char* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  FASTPS_AVX2 static void store(char* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
  }
  FASTPS_AVX2 static void stream(char* p, V v) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v);
  }
  FASTPS_AVX2 static V add(V x, V y) {
    if constexpr (sizeof(I) == 1) return _mm256_add_epi8(x, y);
    if constexpr (sizeof(I) == 2) return _mm256_add_epi16(x, y);
    if constexpr (sizeof(I) == 4) return _mm256_add_epi32(x, y);
    if constexpr (sizeof(I) == 8) return _mm256_add_epi64(x, y);
  }
};

struct Avx2Bool : Avx2Int<uint8_t> {
  using Op = BoolOp;
  FASTPS_AVX2 static V add(V x, V y) {
    // Nonzero bytes become 1: min(x | y, 1).
    return _mm256_min_epu8(_mm256_or_si256(x, y), _mm256_set1_epi8(1));
  }
};

template <class K>
FASTPS_AVX2 void avx2_sum(void* dv, const void* av, const void* bv, size_t n) {
  using T = typename K::Op::T;
  constexpr size_t kBlock = 32;
  static_assert(K::kLanes * sizeof(T) == kBlock, "AVX2 kernels work on 32-byte blocks");
  char* d = static_cast<char*>(dv);
  const char* a = static_cast<const char*>(av);
  const char* b = static_cast<const char*>(bv);
  size_t i = 0;  // bytes done
  const size_t total = n * sizeof(T);
  if (use_streaming(d, a, b, total, sizeof(T), kBlock)) {
    const size_t mis = reinterpret_cast<uintptr_t>(d) & (kBlock - 1);
    const size_t head = (kBlock - mis) & (kBlock - 1);
    scalar_sum_range<typename K::Op>(d, a, b, head / sizeof(T));
    i = head;
    for (; i + 4 * kBlock <= total; i += 4 * kBlock) {
      const auto x0 = K::add(K::load(a + i), K::load(b + i));
      const auto x1 = K::add(K::load(a + i + kBlock), K::load(b + i + kBlock));
      const auto x2 = K::add(K::load(a + i + 2 * kBlock), K::load(b + i + 2 * kBlock));
      const auto x3 = K::add(K::load(a + i + 3 * kBlock), K::load(b + i + 3 * kBlock));
      K::stream(d + i, x0);
      K::stream(d + i + kBlock, x1);
      K::stream(d + i + 2 * kBlock, x2);
      K::stream(d + i + 3 * kBlock, x3);
    }
    for (; i + kBlock <= total; i += kBlock) {
      K::stream(d + i, K::add(K::load(a + i), K::load(b + i)));
    }
    _mm_sfence();
  } else {
    for (; i + 4 * kBlock <= total; i += 4 * kBlock) {
      const auto x0 = K::add(K::load(a + i), K::load(b + i));
      const auto x1 = K::add(K::load(a + i + kBlock), K::load(b + i + kBlock));
      const auto x2 = K::add(K::load(a + i + 2 * kBlock), K::load(b + i + 2 * kBlock));
      const auto x3 = K::add(K::load(a + i + 3 * kBlock), K::load(b + i + 3 * kBlock));
      K::store(d + i, x0);
      K::store(d + i + kBlock, x1);
      K::store(d + i + 2 * kBlock, x2);
      K::store(d + i + 3 * kBlock, x3);
    }
    for (; i + kBlock <= total; i += kBlock) {
      K::store(d + i, K::add(K::load(a + i), K::load(b + i)));
    }
  }
  scalar_sum_range<typename K::Op>(d + i, a + i, b + i, (total - i) / sizeof(T));
}

template <class K>
FASTPS_AVX2 void avx2_scale(void* dv, size_t n, double f) {
  using T = typename K::Op::T;
  constexpr size_t kBlock = 32;
  char* d = static_cast<char*>(dv);
  const size_t total = n * sizeof(T);
  const auto fv = K::factor(f);
  size_t i = 0;
  for (; i + 2 * kBlock <= total; i += 2 * kBlock) {
    const auto x0 = K::mul(K::load(d + i), fv);
    const auto x1 = K::mul(K::load(d + i + kBlock), fv);
    K::store(d + i, x0);
    K::store(d + i + kBlock, x1);
  }
  for (; i + kBlock <= total; i += kBlock) K::store(d + i, K::mul(K::load(d + i), fv));
  scalar_scale_range<typename K::Op>(d + i, (total - i) / sizeof(T), K::Op::factor(f));
}

const KernelSet kAvx2Set = {
    "avx2",
    {avx2_sum<Avx2F32>, avx2_sum<Avx2F64>, avx2_sum<Avx2F16>, avx2_sum<Avx2BF16>,
     avx2_sum<Avx2Int<int32_t>>, avx2_sum<Avx2Int<int64_t>>, avx2_sum<Avx2Int<uint8_t>>,
     avx2_sum<Avx2Int<int8_t>>, avx2_sum<Avx2Int<int16_t>>, avx2_sum<Avx2Bool>},
    // Integer scaling (trunc in double, saturate) is rare and stays scalar.
    {avx2_scale<Avx2F32>, avx2_scale<Avx2F64>, avx2_scale<Avx2F16>, avx2_scale<Avx2BF16>,
     scalar_scale<IntOp<int32_t>>, scalar_scale<IntOp<int64_t>>, scalar_scale<IntOp<uint8_t>>,
     scalar_scale<IntOp<int8_t>>, scalar_scale<IntOp<int16_t>>, scale_noop},
};

// ---------------------------------------------------------------------------
// AVX-512 (F + BW). Blocks are 64 bytes (one cache line); tails use masked
// loads and stores, which never touch memory outside the mask.
// K additionally provides load_n(p, n) and store_n(p, v, n) for n < kLanes.
// ---------------------------------------------------------------------------

#define FASTPS_AVX512 __attribute__((target("avx512f,avx512bw,avx2,f16c")))

inline uint64_t lane_mask(size_t n) { return n >= 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1; }

struct Avx512F32 {
  using Op = F32Op;
  using V = __m512;
  using SV = __m512;
  static constexpr size_t kLanes = 16;
  FASTPS_AVX512 static V load(const char* p) { return _mm512_loadu_ps(p); }
  FASTPS_AVX512 static V load_n(const char* p, size_t n) {
    return _mm512_maskz_loadu_ps(static_cast<__mmask16>(lane_mask(n)), p);
  }
  FASTPS_AVX512 static void store(char* p, V v) { _mm512_storeu_ps(p, v); }
  FASTPS_AVX512 static void store_n(char* p, V v, size_t n) {
    _mm512_mask_storeu_ps(p, static_cast<__mmask16>(lane_mask(n)), v);
  }
  FASTPS_AVX512 static void stream(char* p, V v) {
    _mm512_stream_ps(reinterpret_cast<float*>(p), v);
  }
  FASTPS_AVX512 static V add(V x, V y) { return _mm512_add_ps(x, y); }
  FASTPS_AVX512 static SV factor(double f) { return _mm512_set1_ps(static_cast<float>(f)); }
  FASTPS_AVX512 static V mul(V x, SV f) { return _mm512_mul_ps(x, f); }
};

struct Avx512F64 {
  using Op = F64Op;
  using V = __m512d;
  using SV = __m512d;
  static constexpr size_t kLanes = 8;
  FASTPS_AVX512 static V load(const char* p) { return _mm512_loadu_pd(p); }
  FASTPS_AVX512 static V load_n(const char* p, size_t n) {
    return _mm512_maskz_loadu_pd(static_cast<__mmask8>(lane_mask(n)), p);
  }
  FASTPS_AVX512 static void store(char* p, V v) { _mm512_storeu_pd(p, v); }
  FASTPS_AVX512 static void store_n(char* p, V v, size_t n) {
    _mm512_mask_storeu_pd(p, static_cast<__mmask8>(lane_mask(n)), v);
  }
  FASTPS_AVX512 static void stream(char* p, V v) {
    _mm512_stream_pd(reinterpret_cast<double*>(p), v);
  }
  FASTPS_AVX512 static V add(V x, V y) { return _mm512_add_pd(x, y); }
  FASTPS_AVX512 static SV factor(double f) { return _mm512_set1_pd(f); }
  FASTPS_AVX512 static V mul(V x, SV f) { return _mm512_mul_pd(x, f); }
};

// 32 16-bit floats held as two float32 vectors; Conv supplies
// unpack(__m512i) -> two float vectors and pack(two float vectors) -> __m512i.
struct Avx512F32x2 {
  __m512 lo, hi;
};

template <class Conv>
struct Avx512Half {
  using V = Avx512F32x2;
  using SV = __m512;
  static constexpr size_t kLanes = 32;
  FASTPS_AVX512 static V load(const char* p) { return Conv::unpack(_mm512_loadu_si512(p)); }
  FASTPS_AVX512 static V load_n(const char* p, size_t n) {
    return Conv::unpack(_mm512_maskz_loadu_epi16(static_cast<__mmask32>(lane_mask(n)), p));
  }
  FASTPS_AVX512 static void store(char* p, V v) { _mm512_storeu_si512(p, Conv::pack(v)); }
  FASTPS_AVX512 static void store_n(char* p, V v, size_t n) {
    _mm512_mask_storeu_epi16(p, static_cast<__mmask32>(lane_mask(n)), Conv::pack(v));
  }
  FASTPS_AVX512 static void stream(char* p, V v) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(p), Conv::pack(v));
  }
  FASTPS_AVX512 static V add(V x, V y) {
    return {_mm512_add_ps(x.lo, y.lo), _mm512_add_ps(x.hi, y.hi)};
  }
  FASTPS_AVX512 static SV factor(double f) { return _mm512_set1_ps(static_cast<float>(f)); }
  FASTPS_AVX512 static V mul(V x, SV f) { return {_mm512_mul_ps(x.lo, f), _mm512_mul_ps(x.hi, f)}; }
};

// float16: elements 0-15 and 16-31 through the hardware converters.
struct Avx512F16Conv {
  FASTPS_AVX512 static Avx512F32x2 unpack(__m512i v) {
    return {_mm512_cvtph_ps(_mm512_castsi512_si256(v)),
            _mm512_cvtph_ps(_mm512_extracti64x4_epi64(v, 1))};
  }
  FASTPS_AVX512 static __m512i pack(Avx512F32x2 v) {
    const __m256i lo = _mm512_cvtps_ph(v.lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i hi = _mm512_cvtps_ph(v.hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
};

// bfloat16: in-lane unpack with zero words / packus, as in Avx2BF16.
struct Avx512BF16Conv {
  FASTPS_AVX512 static Avx512F32x2 unpack(__m512i v) {
    const __m512i zero = _mm512_setzero_si512();
    return {_mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, v)),
            _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, v))};
  }
  // float32 -> bfloat16 bits (round to nearest even) in the low half of each
  // 32-bit lane. No NaN special case is needed here: see kBf16NanNote.
  FASTPS_AVX512 static __m512i round(__m512 f) {
    const __m512i u = _mm512_castps_si512(f);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff));
    return _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  }
  FASTPS_AVX512 static __m512i pack(Avx512F32x2 v) {
    return _mm512_packus_epi32(round(v.lo), round(v.hi));
  }
};

struct Avx512F16 : Avx512Half<Avx512F16Conv> {
  using Op = F16Op;
};

struct Avx512BF16 : Avx512Half<Avx512BF16Conv> {
  using Op = BF16Op;
  FASTPS_AVX512 static SV factor(double f) { return _mm512_set1_ps(bf16_safe_factor(f)); }
};

template <typename I>
struct Avx512Int {
  using Op = IntOp<I>;
  using V = __m512i;
  static constexpr size_t kLanes = 64 / sizeof(I);
  FASTPS_AVX512 static V load(const char* p) { return _mm512_loadu_si512(p); }
  FASTPS_AVX512 static V load_n(const char* p, size_t n) {
    const uint64_t m = lane_mask(n);
    if constexpr (sizeof(I) == 1) return _mm512_maskz_loadu_epi8(static_cast<__mmask64>(m), p);
    if constexpr (sizeof(I) == 2) return _mm512_maskz_loadu_epi16(static_cast<__mmask32>(m), p);
    if constexpr (sizeof(I) == 4) return _mm512_maskz_loadu_epi32(static_cast<__mmask16>(m), p);
    if constexpr (sizeof(I) == 8) return _mm512_maskz_loadu_epi64(static_cast<__mmask8>(m), p);
  }
  FASTPS_AVX512 static void store(char* p, V v) { _mm512_storeu_si512(p, v); }
  FASTPS_AVX512 static void store_n(char* p, V v, size_t n) {
    const uint64_t m = lane_mask(n);
    if constexpr (sizeof(I) == 1) _mm512_mask_storeu_epi8(p, static_cast<__mmask64>(m), v);
    if constexpr (sizeof(I) == 2) _mm512_mask_storeu_epi16(p, static_cast<__mmask32>(m), v);
    if constexpr (sizeof(I) == 4) _mm512_mask_storeu_epi32(p, static_cast<__mmask16>(m), v);
    if constexpr (sizeof(I) == 8) _mm512_mask_storeu_epi64(p, static_cast<__mmask8>(m), v);
  }
  FASTPS_AVX512 static void stream(char* p, V v) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(p), v);
  }
  FASTPS_AVX512 static V add(V x, V y) {
    if constexpr (sizeof(I) == 1) return _mm512_add_epi8(x, y);
    if constexpr (sizeof(I) == 2) return _mm512_add_epi16(x, y);
    if constexpr (sizeof(I) == 4) return _mm512_add_epi32(x, y);
    if constexpr (sizeof(I) == 8) return _mm512_add_epi64(x, y);
  }
};

struct Avx512Bool : Avx512Int<uint8_t> {
  using Op = BoolOp;
  FASTPS_AVX512 static V add(V x, V y) {
    return _mm512_min_epu8(_mm512_or_si512(x, y), _mm512_set1_epi8(1));
  }
};

template <class K>
FASTPS_AVX512 void avx512_sum(void* dv, const void* av, const void* bv, size_t n) {
  using T = typename K::Op::T;
  constexpr size_t kBlock = 64;
  static_assert(K::kLanes * sizeof(T) == kBlock, "AVX-512 kernels work on 64-byte blocks");
  char* d = static_cast<char*>(dv);
  const char* a = static_cast<const char*>(av);
  const char* b = static_cast<const char*>(bv);
  size_t i = 0;  // bytes done
  const size_t total = n * sizeof(T);
  if (use_streaming(d, a, b, total, sizeof(T), kBlock)) {
    const size_t mis = reinterpret_cast<uintptr_t>(d) & (kBlock - 1);
    const size_t head = ((kBlock - mis) & (kBlock - 1)) / sizeof(T);
    if (head) K::store_n(d, K::add(K::load_n(a, head), K::load_n(b, head)), head);
    i = head * sizeof(T);
    for (; i + 4 * kBlock <= total; i += 4 * kBlock) {
      const auto x0 = K::add(K::load(a + i), K::load(b + i));
      const auto x1 = K::add(K::load(a + i + kBlock), K::load(b + i + kBlock));
      const auto x2 = K::add(K::load(a + i + 2 * kBlock), K::load(b + i + 2 * kBlock));
      const auto x3 = K::add(K::load(a + i + 3 * kBlock), K::load(b + i + 3 * kBlock));
      K::stream(d + i, x0);
      K::stream(d + i + kBlock, x1);
      K::stream(d + i + 2 * kBlock, x2);
      K::stream(d + i + 3 * kBlock, x3);
    }
    for (; i + kBlock <= total; i += kBlock) {
      K::stream(d + i, K::add(K::load(a + i), K::load(b + i)));
    }
    _mm_sfence();
  } else {
    for (; i + 4 * kBlock <= total; i += 4 * kBlock) {
      const auto x0 = K::add(K::load(a + i), K::load(b + i));
      const auto x1 = K::add(K::load(a + i + kBlock), K::load(b + i + kBlock));
      const auto x2 = K::add(K::load(a + i + 2 * kBlock), K::load(b + i + 2 * kBlock));
      const auto x3 = K::add(K::load(a + i + 3 * kBlock), K::load(b + i + 3 * kBlock));
      K::store(d + i, x0);
      K::store(d + i + kBlock, x1);
      K::store(d + i + 2 * kBlock, x2);
      K::store(d + i + 3 * kBlock, x3);
    }
    for (; i + kBlock <= total; i += kBlock) {
      K::store(d + i, K::add(K::load(a + i), K::load(b + i)));
    }
  }
  const size_t rest = (total - i) / sizeof(T);
  if (rest) K::store_n(d + i, K::add(K::load_n(a + i, rest), K::load_n(b + i, rest)), rest);
}

template <class K>
FASTPS_AVX512 void avx512_scale(void* dv, size_t n, double f) {
  using T = typename K::Op::T;
  constexpr size_t kBlock = 64;
  char* d = static_cast<char*>(dv);
  const size_t total = n * sizeof(T);
  const auto fv = K::factor(f);
  size_t i = 0;
  for (; i + 2 * kBlock <= total; i += 2 * kBlock) {
    const auto x0 = K::mul(K::load(d + i), fv);
    const auto x1 = K::mul(K::load(d + i + kBlock), fv);
    K::store(d + i, x0);
    K::store(d + i + kBlock, x1);
  }
  for (; i + kBlock <= total; i += kBlock) K::store(d + i, K::mul(K::load(d + i), fv));
  const size_t rest = (total - i) / sizeof(T);
  if (rest) K::store_n(d + i, K::mul(K::load_n(d + i, rest), fv), rest);
}

const KernelSet kAvx512Set = {
    "avx512",
    {avx512_sum<Avx512F32>, avx512_sum<Avx512F64>, avx512_sum<Avx512F16>, avx512_sum<Avx512BF16>,
     avx512_sum<Avx512Int<int32_t>>, avx512_sum<Avx512Int<int64_t>>, avx512_sum<Avx512Int<uint8_t>>,
     avx512_sum<Avx512Int<int8_t>>, avx512_sum<Avx512Int<int16_t>>, avx512_sum<Avx512Bool>},
    {avx512_scale<Avx512F32>, avx512_scale<Avx512F64>, avx512_scale<Avx512F16>,
     avx512_scale<Avx512BF16>, scalar_scale<IntOp<int32_t>>, scalar_scale<IntOp<int64_t>>,
     scalar_scale<IntOp<uint8_t>>, scalar_scale<IntOp<int8_t>>, scalar_scale<IntOp<int16_t>>,
     scale_noop},
};

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
}

#endif  // FASTPS_X86

// The variant named `level` if this CPU can run it, else nullptr.
const KernelSet* find_set(const std::string& level) {
  if (level == "scalar") return &kScalarSet;
#if FASTPS_X86
  if (level == "avx2" && cpu_has_avx2()) return &kAvx2Set;
  if (level == "avx512" && cpu_has_avx512()) return &kAvx512Set;
#endif
  return nullptr;
}

const KernelSet* best_set() {
  // FASTPS_SIMD=avx512|avx2|scalar selects the variant (e.g. avx2 to avoid
  // AVX-512 clock drops); an unknown or unsupported value is ignored.
  if (const char* env = std::getenv("FASTPS_SIMD")) {
    if (const KernelSet* s = find_set(env)) return s;
  }
#if FASTPS_X86
  if (cpu_has_avx512()) return &kAvx512Set;
  if (cpu_has_avx2()) return &kAvx2Set;
#endif
  return &kScalarSet;
}

// Detected once, on first use (thread-safe static initialisation).
std::atomic<const KernelSet*>& active() {
  static std::atomic<const KernelSet*> set{best_set()};
  return set;
}

const KernelSet& kernels() { return *active().load(std::memory_order_acquire); }

size_t check(DType dt) {
  const size_t i = static_cast<size_t>(dt);
  if (i >= kNumTypes) throw std::invalid_argument("invalid dtype code " + std::to_string(i));
  return i;
}

}  // namespace

void sum_into(void* dst, const void* src, size_t count, DType dt) {
  const size_t i = check(dt);
  if (count == 0) return;
  kernels().sum[i](dst, dst, src, count);
}

void sum_to(void* dst, const void* a, const void* b, size_t count, DType dt) {
  const size_t i = check(dt);
  if (count == 0) return;
  kernels().sum[i](dst, a, b, count);
}

void scale(void* dst, size_t count, DType dt, double factor) {
  const size_t i = check(dt);
  if (count == 0) return;
  kernels().scale[i](dst, count, factor);
}

const char* simd_level() { return kernels().name; }

std::vector<std::string> simd_levels_built() {
#if FASTPS_X86
  return {"scalar", "avx2", "avx512"};
#else
  return {"scalar"};
#endif
}

std::vector<std::string> simd_levels_supported() {
  std::vector<std::string> out;
  for (const std::string& level : simd_levels_built())
    if (find_set(level) != nullptr) out.push_back(level);
  return out;
}

bool set_simd_level(const char* level) {
  if (level == nullptr) return false;
  const KernelSet* s = find_set(level);
  if (s == nullptr) return false;
  active().store(s, std::memory_order_release);
  return true;
}

}  // namespace fastps
