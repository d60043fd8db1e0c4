// SHA-256 (FIPS 180-4, section 6.2) and HMAC (RFC 2104) over it.
#include "common/hmac_sha256.h"

#include <cstring>

namespace fastps {

namespace {

// First 32 bits of the fractional parts of the cube roots of the first 64
// primes (FIPS 180-4, 4.2.2).
constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

// First 32 bits of the fractional parts of the square roots of the first 8
// primes (FIPS 180-4, 5.3.3).
constexpr uint32_t kInit[8] = {
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
};

constexpr size_t kBlockBytes = 64;

inline uint32_t rotr(uint32_t x, unsigned n) { return (x >> n) | (x << (32 - n)); }

inline uint32_t load_be32(const uint8_t* p) {
  return (static_cast<uint32_t>(p[0]) << 24) | (static_cast<uint32_t>(p[1]) << 16) |
         (static_cast<uint32_t>(p[2]) << 8) | static_cast<uint32_t>(p[3]);
}

inline void store_be32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}

class Sha256 {
 public:
  Sha256() { std::memcpy(h_, kInit, sizeof h_); }

  void update(const void* data, size_t len) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    total_ += len;
    if (buffered_ > 0) {
      const size_t take = len < kBlockBytes - buffered_ ? len : kBlockBytes - buffered_;
      std::memcpy(buf_ + buffered_, p, take);
      buffered_ += take;
      p += take;
      len -= take;
      if (buffered_ < kBlockBytes) return;
      compress(buf_);
      buffered_ = 0;
    }
    for (; len >= kBlockBytes; p += kBlockBytes, len -= kBlockBytes) compress(p);
    if (len > 0) {
      std::memcpy(buf_, p, len);
      buffered_ = len;
    }
  }

  Digest finish() {
    // Padding (5.1.1): a 1 bit, zeros to 56 mod 64 bytes, then the message
    // length in bits as a 64-bit big-endian number.
    const uint64_t bits = static_cast<uint64_t>(total_) * 8;
    uint8_t pad[kBlockBytes + 8] = {0x80};
    const size_t pad_len = (buffered_ < 56 ? 56 : 120) - buffered_;
    update(pad, pad_len);
    uint8_t len_be[8];
    for (int i = 0; i < 8; ++i) len_be[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
    update(len_be, 8);
    Digest out;
    for (int i = 0; i < 8; ++i) store_be32(out.data() + 4 * i, h_[i]);
    return out;
  }

 private:
  void compress(const uint8_t* block) {
    uint32_t w[64];
    for (int t = 0; t < 16; ++t) w[t] = load_be32(block + 4 * t);
    for (int t = 16; t < 64; ++t) {
      const uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      const uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3];
    uint32_t e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int t = 0; t < 64; ++t) {
      const uint32_t big_s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
      const uint32_t ch = (e & f) ^ (~e & g);
      const uint32_t t1 = h + big_s1 + ch + kRound[t] + w[t];
      const uint32_t big_s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
      const uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
      const uint32_t t2 = big_s0 + maj;
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h_[0] += a;
    h_[1] += b;
    h_[2] += c;
    h_[3] += d;
    h_[4] += e;
    h_[5] += f;
    h_[6] += g;
    h_[7] += h;
  }

  uint32_t h_[8];
  uint8_t buf_[kBlockBytes];
  size_t buffered_ = 0;
  size_t total_ = 0;
};

}  // namespace

Digest sha256(const void* data, size_t len) {
  Sha256 s;
  s.update(data, len);
  return s.finish();
}

Digest hmac_sha256(const void* key, size_t key_len, const void* msg, size_t msg_len) {
  // RFC 2104: keys longer than the block are hashed first; the (possibly
  // hashed) key is zero-padded to the block size.
  uint8_t k0[kBlockBytes] = {};
  if (key_len > kBlockBytes) {
    const Digest hk = sha256(key, key_len);
    std::memcpy(k0, hk.data(), hk.size());
  } else if (key_len > 0) {
    std::memcpy(k0, key, key_len);
  }
  uint8_t ipad[kBlockBytes];
  uint8_t opad[kBlockBytes];
  for (size_t i = 0; i < kBlockBytes; ++i) {
    ipad[i] = static_cast<uint8_t>(k0[i] ^ 0x36);
    opad[i] = static_cast<uint8_t>(k0[i] ^ 0x5c);
  }
  Sha256 inner;
  inner.update(ipad, sizeof ipad);
  if (msg_len > 0) inner.update(msg, msg_len);
  const Digest ih = inner.finish();
  Sha256 outer;
  outer.update(opad, sizeof opad);
  outer.update(ih.data(), ih.size());
  return outer.finish();
}

bool digest_equal(const Digest& a, const Digest& b) {
  // Accumulate every difference; no early exit, so timing does not reveal
  // the position of the first mismatch.
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = static_cast<uint8_t>(diff | (a[i] ^ b[i]));
  return diff == 0;
}

std::string to_hex(const Digest& d) {
  static const char kHex[] = "0123456789abcdef";
  std::string s(d.size() * 2, '0');
  for (size_t i = 0; i < d.size(); ++i) {
    s[2 * i] = kHex[d[i] >> 4];
    s[2 * i + 1] = kHex[d[i] & 0xf];
  }
  return s;
}

}  // namespace fastps
