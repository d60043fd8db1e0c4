// Top-k sparsification (Aji & Heafield 2017; Lin et al. 2018, "Deep Gradient
// Compression"): the k values of largest magnitude travel with their indices (uint32
// index, float32 value each), the rest is dropped (and carried over by error feedback).
//
// Selection without a sort of the part (docs/guide/compression.md, "Top-k"): magnitudes are
// compared as integer keys; a threshold taken from an even sample of them lets one
// vectorised pass keep only about 2k candidates, and the k-th largest is selected among
// those. A sparse part (a server's sum of sparse pushes: its sample is mostly zeros)
// takes its nonzeros as the candidates.
#include <emmintrin.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "compression/codecs.h"

namespace fastps {
namespace {

// |x| as an integer key: for non-negative floats the integer order is the float order.
// NaN maps to +inf's key, so it ranks first (it must reach the sum, as without
// compression) and ties with inf by index. Below 2^31: signed compares vectorise on SSE2.
inline int32_t magnitude_key(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  b &= 0x7FFFFFFFu;
  return static_cast<int32_t>(b < 0x7F800000u ? b : 0x7F800000u);
}

// Appends to cand (capacity n) the indices whose key is at least t (t >= 1), in index
// order; returns how many. SSE2 (every x86-64): 16 values per step, |x|'s bits compared
// with t - 1 as signed integers (NaN's bits pass any t, as its key does), and the
// passing lanes' indices taken from the compare mask. With about 2% passing, most steps
// write nothing.
size_t collect_at_least(const float* x, size_t n, int32_t t, uint32_t* cand) {
  size_t c = 0, i = 0;
  const __m128i abs_mask = _mm_set1_epi32(0x7FFFFFFF);
  const __m128i below = _mm_set1_epi32(t - 1);
  auto pass = [&](size_t at) {
    __m128i v = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + at)), abs_mask);
    return _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(v, below)));
  };
  for (; i + 16 <= n; i += 16) {
    unsigned mask =
        static_cast<unsigned>(pass(i) | pass(i + 4) << 4 | pass(i + 8) << 8 | pass(i + 12) << 12);
    for (; mask; mask &= mask - 1)
      cand[c++] = static_cast<uint32_t>(i + static_cast<size_t>(__builtin_ctz(mask)));
  }
  for (; i < n; ++i)
    if (magnitude_key(x[i]) >= t) cand[c++] = static_cast<uint32_t>(i);
  return c;
}

// Per-thread scratch (a push thread, a server engine): no allocation per part.
struct Scratch {
  std::vector<uint32_t> cand;
  std::vector<int32_t> keys;
  std::vector<int32_t> sorted;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

inline void put(char* body, size_t k, size_t j, uint32_t i, float v) {
  std::memcpy(body + 4 * j, &i, 4);
  std::memcpy(body + 4 * (k + j), &v, 4);
}

class TopKCompressor : public Compressor {
 public:
  explicit TopKCompressor(float param) : param_(param) {}
  size_t max_body(size_t n) const override { return 8 * sparse_k(param_, n); }

  // The body holds, in index order, every value whose key is above the k-th largest key
  // and values equal to it from the lowest index on: the same set on every process, the
  // set numpy's stable argsort of -|x| picks.
  size_t compress(const float* x, size_t n, uint64_t, char* body) const override {
    const size_t k = sparse_k(param_, n);
    if (k == 0) return 0;
    if (k == n) {
      for (size_t i = 0; i < n; ++i) put(body, k, i, static_cast<uint32_t>(i), x[i]);
      return 8 * k;
    }
    Scratch& s = scratch();
    if (s.cand.size() < n + 1) s.cand.resize(n + 1);
    uint32_t* cand = s.cand.data();
    size_t c = 0;
    bool sampled = false;
    const size_t m = 2048;
    if (n > 4 * m && 8 * k < n) {
      // A threshold low enough that about 2k values pass (8 ranks of slack).
      s.sorted.resize(m);
      const size_t stride = n / m;
      for (size_t i = 0; i < m; ++i) s.sorted[i] = magnitude_key(x[i * stride]);
      const size_t rank = std::min(m - 1, 2 * k * m / n + 8);  // from the top
      std::nth_element(s.sorted.begin(), s.sorted.begin() + rank, s.sorted.end(),
                       std::greater<int32_t>());
      int32_t t0 = s.sorted[rank];
      if (t0 == 0) {
        // Mostly zeros: the nonzeros are the candidates; if fewer than k, all of them go
        // with the lowest-index zeros.
        c = collect_at_least(x, n, 1, cand);
        if (c < k) return with_zeros(x, n, k, c, body);
      } else {
        c = collect_at_least(x, n, t0, cand);
      }
      sampled = c >= k;  // an unlucky sample: too few passed, select among all
    }
    if (!sampled) {
      c = n;
      for (size_t i = 0; i < n; ++i) cand[i] = static_cast<uint32_t>(i);
    }
    // The k-th largest key among the candidates.
    s.keys.resize(c);
    for (size_t j = 0; j < c; ++j) s.keys[j] = magnitude_key(x[cand[j]]);
    s.sorted.assign(s.keys.begin(), s.keys.end());
    std::nth_element(s.sorted.begin(), s.sorted.begin() + (c - k), s.sorted.end());
    const int32_t t = s.sorted[c - k];
    size_t above = 0;
    for (size_t j = 0; j < c; ++j) above += s.keys[j] > t;
    size_t ties = k - above, out = 0;
    for (size_t j = 0; j < c && out < k; ++j) {
      int32_t key = s.keys[j];
      if (key > t || (key == t && ties > 0)) {
        if (key == t) --ties;
        put(body, k, out++, cand[j], x[cand[j]]);
      }
    }
    return 8 * k;
  }

  size_t compress_residual(float* c, size_t n, uint64_t seed, char* body) const override {
    size_t bytes = compress(c, n, seed, body);
    size_t k = bytes / 8;
    for (size_t j = 0; j < k; ++j) {  // what was sent leaves the residual
      uint32_t i;
      std::memcpy(&i, body + 4 * j, 4);
      c[i] = 0.0f;
    }
    return bytes;
  }
  void zero_sent(const char* body, size_t bytes, size_t, uint64_t, float* v) const override {
    for (size_t j = 0; j < bytes / 8; ++j) {
      uint32_t i;
      std::memcpy(&i, body + 4 * j, 4);
      v[i] = 0.0f;
    }
  }
  void decompress(const char* body, size_t bytes, size_t n, uint64_t seed,
                  float* out) const override {
    std::fill(out, out + n, 0.0f);
    decompress_add(body, bytes, n, seed, out);
  }
  void decompress_add(const char* body, size_t bytes, size_t n, uint64_t,
                      float* acc) const override {
    size_t k = sparse_k(param_, n);
    check_body("topk", bytes, 8 * k, n);
    for (size_t j = 0; j < k; ++j) {
      uint32_t i;
      float v;
      std::memcpy(&i, body + 4 * j, 4);
      std::memcpy(&v, body + 4 * (k + j), 4);
      if (i >= n)
        throw std::invalid_argument("compressed part (topk, " + std::to_string(n) +
                                    " elements) names index " + std::to_string(i));
      acc[i] += v;
    }
  }

 private:
  // Fewer than k nonzeros (the c indices in cand): all of them and the first k - c zeros,
  // merged in index order.
  static size_t with_zeros(const float* x, size_t n, size_t k, size_t c, char* body) {
    const uint32_t* cand = scratch().cand.data();
    size_t zeros = k - c, out = 0, j = 0;
    for (size_t i = 0; i < n && out < k; ++i) {
      if (j < c && cand[j] == i) {
        put(body, k, out++, static_cast<uint32_t>(i), x[i]);
        ++j;
      } else if (zeros > 0) {
        put(body, k, out++, static_cast<uint32_t>(i), x[i]);
        --zeros;
      }
    }
    return 8 * k;
  }

  float param_;
};

}  // namespace

std::unique_ptr<Compressor> make_topk_compressor(float param) {
  return std::make_unique<TopKCompressor>(param);
}

}  // namespace fastps
