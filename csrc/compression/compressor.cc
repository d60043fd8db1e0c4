#include "compression/compressor.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "compression/codecs.h"

namespace fastps {

const char* codec_name(Codec c) {
  switch (c) {
    case Codec::kNone:
      return "none";
    case Codec::kFP16:
      return "fp16";
    case Codec::kBF16:
      return "bf16";
    case Codec::kOneBit:
      return "onebit";
    case Codec::kTopK:
      return "topk";
    case Codec::kRandomK:
      return "randomk";
    case Codec::kDithering:
      return "dithering";
    default:
      return "?";
  }
}

namespace {

bool takes_param(Codec c) {
  return c == Codec::kTopK || c == Codec::kRandomK || c == Codec::kDithering;
}

}  // namespace

std::string CompressionSpec::describe() const {
  std::ostringstream os;
  os << codec_name(codec);
  if (takes_param(codec)) os << ":" << param;
  if (error_feedback) os << ":ef";
  if (momentum > 0) os << ":momentum=" << momentum;
  if (warmup > 0) os << ":warmup=" << warmup;
  return os.str();
}

CompressionSpec CompressionSpec::at_round(uint64_t round) const {
  CompressionSpec s = *this;
  s.warmup = 0;
  if (round >= warmup || !(param > 0 && param < 1)) return s;
  uint64_t stage = round * kWarmupStages / warmup;  // 0 .. kWarmupStages - 1
  double kept = std::pow(static_cast<double>(param),
                         static_cast<double>(stage + 1) / static_cast<double>(kWarmupStages + 1));
  // Never below k itself (float rounding at the last stage).
  s.param = std::max(param, std::min(static_cast<float>(kept), std::nextafter(1.0f, 0.0f)));
  return s;
}

CompressionSpec CompressionSpec::parse(const std::string& text) {
  std::vector<std::string> fields;
  std::string cur;
  for (char ch : text) {
    if (ch == ':') {
      fields.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  fields.push_back(cur);
  CompressionSpec s;
  if (text.empty()) return s;
  const std::string& name = fields[0];
  bool found = false;
  for (uint8_t c = 0; c < static_cast<uint8_t>(Codec::kCount); ++c)
    if (name == codec_name(static_cast<Codec>(c))) {
      s.codec = static_cast<Codec>(c);
      found = true;
    }
  if (!found)
    throw std::invalid_argument("compression '" + text + "': unknown compressor '" + name +
                                "' (none, fp16, bf16, onebit, topk, randomk, dithering)");
  size_t next = 1;
  if (takes_param(s.codec)) {
    if (fields.size() < 2 || fields[1].empty())
      throw std::invalid_argument("compression '" + text + "': " + name +
                                  " needs a parameter, e.g. " + name +
                                  (s.codec == Codec::kDithering ? ":16" : ":0.01"));
    size_t used = 0;
    try {
      s.param = std::stof(fields[1], &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != fields[1].size() || !std::isfinite(s.param) || s.param <= 0)
      throw std::invalid_argument("compression '" + text + "': parameter '" + fields[1] +
                                  "' must be a positive number");
    next = 2;
  }
  for (; next < fields.size(); ++next) {
    if (fields[next] == "ef" && s.codec != Codec::kNone && !s.error_feedback && !s.momentum) {
      s.error_feedback = true;
      continue;
    }
    const std::string key = "momentum=";
    if (fields[next].compare(0, key.size(), key) == 0 && !s.momentum) {
      std::string value = fields[next].substr(key.size());
      if (s.codec != Codec::kTopK || !s.error_feedback)
        throw std::invalid_argument("compression '" + text +
                                    "': momentum correction applies to top-k with error "
                                    "feedback only (topk:K:ef:momentum=M)");
      size_t used = 0;
      float m = 0;
      try {
        m = std::stof(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      uint16_t units = used == value.size() && m > 0 && m < 1 ? momentum_units(m) : 0;
      if (units == 0 || units >= 10000)
        throw std::invalid_argument("compression '" + text + "': momentum '" + value +
                                    "' must be a number from 0.0001 to 0.9999");
      s.momentum = momentum_of_units(units);
      continue;
    }
    const std::string wkey = "warmup=";
    if (fields[next].compare(0, wkey.size(), wkey) == 0 && !s.warmup) {
      std::string value = fields[next].substr(wkey.size());
      if ((s.codec != Codec::kTopK && s.codec != Codec::kRandomK) || !(s.param < 1))
        throw std::invalid_argument("compression '" + text +
                                    "': a sparsity warm-up applies to a fractional top-k or "
                                    "random-k only (randomk:0.01:ef:warmup=ROUNDS)");
      size_t used = 0;
      unsigned long rounds = 0;
      try {
        rounds = value.empty() || value[0] == '-' ? 0 : std::stoul(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != value.size() || rounds < kWarmupStages || rounds > 0xFFFFFFFFul)
        throw std::invalid_argument("compression '" + text + "': warmup '" + value +
                                    "' must be a whole number of rounds from " +
                                    std::to_string(kWarmupStages) + " to 4294967295");
      s.warmup = static_cast<uint32_t>(rounds);
      continue;
    }
    throw std::invalid_argument("compression '" + text + "': unexpected field '" + fields[next] +
                                "'");
  }
  if (s.enabled()) make_compressor(s);  // checks the parameter's range
  return s;
}

void Compressor::decompress_add(const char* body, size_t bytes, size_t n, uint64_t seed,
                                float* acc) const {
  std::vector<float> tmp(n);
  decompress(body, bytes, n, seed, tmp.data());
  for (size_t i = 0; i < n; ++i) acc[i] += tmp[i];
}

size_t Compressor::compress_residual(float* c, size_t n, uint64_t seed, char* body) const {
  size_t bytes = compress(c, n, seed, body);
  std::vector<float> sent(n);
  decompress(body, bytes, n, seed, sent.data());
  for (size_t i = 0; i < n; ++i) c[i] -= sent[i];
  return bytes;
}

void Compressor::zero_sent(const char*, size_t, size_t n, uint64_t, float* v) const {
  std::fill(v, v + n, 0.0f);
}

uint16_t momentum_units(float momentum) {
  double u = std::round(static_cast<double>(momentum) * 10000.0);
  return u < 0 || u > 65535 ? 0 : static_cast<uint16_t>(u);
}

float momentum_of_units(uint16_t units) { return static_cast<float>(units / 10000.0); }

std::unique_ptr<Compressor> make_compressor(const CompressionSpec& spec) {
  switch (spec.codec) {
    case Codec::kFP16:
      return make_fp16_compressor();
    case Codec::kBF16:
      return make_bf16_compressor();
    case Codec::kOneBit:
      return make_onebit_compressor();
    case Codec::kTopK:
    case Codec::kRandomK:
      if (!(spec.param > 0) || (spec.param >= 1 && spec.param != std::floor(spec.param)))
        throw std::invalid_argument("compression " + spec.describe() +
                                    ": k must be a fraction in (0, 1) or a whole count");
      return spec.codec == Codec::kTopK ? make_topk_compressor(spec.param)
                                        : make_randomk_compressor(spec.param);
    case Codec::kDithering:
      if (spec.param != std::floor(spec.param) || spec.param < 1 || spec.param > 127)
        throw std::invalid_argument("compression " + spec.describe() +
                                    ": levels must be a whole number from 1 to 127");
      return make_dithering_compressor(static_cast<unsigned>(spec.param));
    default:
      throw std::invalid_argument("compression '" + spec.describe() + "' has no codec");
  }
}

size_t sparse_k(float param, size_t n) {
  if (n == 0) return 0;
  double k = static_cast<double>(param);
  if (param < 1) {
    // param is a float32 (it travels in the header): 0.05f is 0.0500000007, so ceil of
    // 0.05f * 640 would be 33. A product within float32's precision of a whole number is
    // that number: k is ceil(param * n) of the fraction the user wrote.
    double x = k * static_cast<double>(n);
    double whole = std::round(x);
    k = std::fabs(x - whole) <= x * 1e-7 ? whole : std::ceil(x);
  }
  if (k < 1) k = 1;
  if (k > static_cast<double>(n)) k = static_cast<double>(n);
  return static_cast<size_t>(k);
}

uint64_t random_at(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void randomk_indices(uint64_t seed, size_t n, size_t k, uint32_t* out) {
  // Floyd's sampling: k draws, each a distinct index, whatever n is. The chosen set is a
  // bitmap (per thread, n / 8 bytes), whose scan yields the indices in ascending order.
  thread_local std::vector<uint64_t> chosen;
  chosen.assign((n + 63) / 64, 0);
  auto taken = [](uint32_t i) { return (chosen[i >> 6] >> (i & 63)) & 1; };
  size_t m = 0;
  for (size_t j = n - k; j < n; ++j, ++m) {
    auto t = static_cast<uint32_t>(random_at(seed, m) % (j + 1));
    uint32_t pick = taken(t) ? static_cast<uint32_t>(j) : t;
    chosen[pick >> 6] |= uint64_t{1} << (pick & 63);
  }
  size_t o = 0;
  for (size_t w = 0; w < chosen.size(); ++w)
    for (uint64_t bits = chosen[w]; bits; bits &= bits - 1)
      out[o++] = static_cast<uint32_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(bits)));
}

void check_body(const char* codec, size_t bytes, size_t expected, size_t n) {
  if (bytes != expected)
    throw std::invalid_argument(std::string("compressed part (") + codec + ", " +
                                std::to_string(n) + " elements) has " + std::to_string(bytes) +
                                " bytes of body; expected " + std::to_string(expected));
}

}  // namespace fastps
