#include "compression/part_codec.h"

#include <cstring>
#include <stdexcept>

#include "kernels/half.h"

namespace fastps {

bool compressible(DType dt) {
  return dt == DType::kFloat32 || dt == DType::kFloat64 || dt == DType::kFloat16 ||
         dt == DType::kBFloat16;
}

void to_float(const void* src, DType dt, size_t n, float* dst) {
  switch (dt) {
    case DType::kFloat32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kFloat64: {
      const auto* s = static_cast<const double*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case DType::kFloat16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = half::fp16_to_float(s[i]);
      return;
    }
    case DType::kBFloat16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = half::bf16_to_float(s[i]);
      return;
    }
    default:
      throw std::invalid_argument(std::string("compression: ") + dtype_name(dt) +
                                  " tensors cannot be compressed (float types only)");
  }
}

void from_float(const float* src, size_t n, DType dt, void* dst) {
  switch (dt) {
    case DType::kFloat32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kFloat64: {
      auto* d = static_cast<double*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = src[i];
      return;
    }
    case DType::kFloat16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = half::float_to_fp16(src[i]);
      return;
    }
    case DType::kBFloat16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = half::float_to_bf16(src[i]);
      return;
    }
    default:
      throw std::invalid_argument(std::string("compression: ") + dtype_name(dt) +
                                  " tensors cannot be compressed (float types only)");
  }
}

uint64_t max_compressed_bytes(uint64_t elements) {
  // top-k at k = n is the largest body: 8 bytes per value.
  return sizeof(CompressedHeader) + 8 * elements + 8;
}

uint64_t compressed_bytes(const CompressionSpec& spec, size_t n) {
  uint64_t body = 0;
  switch (spec.codec) {
    case Codec::kFP16:
    case Codec::kBF16:
      body = 2 * n;
      break;
    case Codec::kOneBit:
      body = 4 + (n + 7) / 8;
      break;
    case Codec::kTopK:
      body = 8 * sparse_k(spec.param, n);
      break;
    case Codec::kRandomK:
      body = 4 * sparse_k(spec.param, n);
      break;
    case Codec::kDithering:
      body = 4 + n;
      break;
    default:
      body = 4 * n;
      break;
  }
  return sizeof(CompressedHeader) + body;
}

std::shared_ptr<std::vector<char>> encode_part(const CompressionSpec& spec, const void* in,
                                               DType dt, size_t n, uint64_t seed, ErrorFeedback* ef,
                                               uint64_t key) {
  auto codec = make_compressor(spec);
  auto out = std::make_shared<std::vector<char>>(sizeof(CompressedHeader) + codec->max_body(n));
  CompressedHeader h{};
  h.magic = kCompressedMagic;
  h.codec = static_cast<uint8_t>(spec.codec);
  h.flags = spec.error_feedback ? kCompressedErrorFeedback : 0;
  h.momentum = momentum_units(spec.momentum);
  h.elements = static_cast<uint32_t>(n);
  h.param = spec.param;
  h.seed = seed;
  std::memcpy(out->data(), &h, sizeof h);
  char* body = out->data() + sizeof h;
  size_t bytes;
  if (ef) {
    // residual += input, compressed in place: what is left is the next residual.
    float* r = ef->residual(key, n);
    std::vector<float> converted;
    const auto* x = static_cast<const float*>(in);
    if (dt != DType::kFloat32) {
      converted.resize(n);
      to_float(in, dt, n, converted.data());
      x = converted.data();
    }
    float* u = nullptr;
    if (spec.momentum > 0) {
      // Momentum correction (Lin et al. 2018): the velocity u = m u + x is what
      // accumulates, so what a part sends late still carries its momentum.
      u = ef->velocity(key, n);
      const float m = spec.momentum;
      for (size_t i = 0; i < n; ++i) {
        u[i] = m * u[i] + x[i];
        r[i] += u[i];
      }
    } else {
      for (size_t i = 0; i < n; ++i) r[i] += x[i];
    }
    bytes = codec->compress_residual(r, n, seed, body);
    // Momentum factor masking: a value sent restarts its velocity, as its residual.
    if (u) codec->zero_sent(body, bytes, n, seed, u);
  } else if (dt == DType::kFloat32) {
    bytes = codec->compress(static_cast<const float*>(in), n, seed, body);
  } else {
    std::vector<float> x(n);
    to_float(in, dt, n, x.data());
    bytes = codec->compress(x.data(), n, seed, body);
  }
  out->resize(sizeof h + bytes);
  return out;
}

CompressedHeader read_compressed_header(const char* data, size_t len) {
  CompressedHeader h{};
  if (len < sizeof h)
    throw std::invalid_argument("compressed part of " + std::to_string(len) +
                                " bytes is shorter than its " + std::to_string(sizeof h) +
                                "-byte header");
  std::memcpy(&h, data, sizeof h);
  if (h.magic != kCompressedMagic)
    throw std::invalid_argument("compressed part does not start with the compression magic");
  if (h.codec == 0 || h.codec >= static_cast<uint8_t>(Codec::kCount))
    throw std::invalid_argument("compressed part names unknown codec " +
                                std::to_string(static_cast<unsigned>(h.codec)));
  if (h.flags & ~kCompressedErrorFeedback)
    throw std::invalid_argument("compressed part has unknown header bits");
  if (h.momentum && (h.codec != static_cast<uint8_t>(Codec::kTopK) ||
                     !(h.flags & kCompressedErrorFeedback) || h.momentum >= 10000))
    throw std::invalid_argument("compressed part has a momentum of " + std::to_string(h.momentum) +
                                "e-4 (top-k with error feedback only, below 1)");
  return h;
}

CompressionSpec spec_of(const CompressedHeader& h) {
  CompressionSpec s;
  s.codec = static_cast<Codec>(h.codec);
  s.param = h.param;
  s.error_feedback = (h.flags & kCompressedErrorFeedback) != 0;
  s.momentum = momentum_of_units(h.momentum);
  return s;
}

void decode_part(const char* data, size_t len, size_t n, float* out, bool add) {
  CompressedHeader h = read_compressed_header(data, len);
  if (h.elements != n)
    throw std::invalid_argument("compressed part holds " + std::to_string(h.elements) +
                                " values; expected " + std::to_string(n));
  auto codec = make_compressor(spec_of(h));  // checks the parameter
  const char* body = data + sizeof h;
  size_t bytes = len - sizeof h;
  if (add)
    codec->decompress_add(body, bytes, n, h.seed, out);
  else
    codec->decompress(body, bytes, n, h.seed, out);
}

uint64_t round_seed(const CompressionSpec& spec, uint64_t key, uint64_t round, uint32_t salt) {
  uint64_t s = random_at(key, round);
  if (spec.codec == Codec::kDithering) s = random_at(s, salt);
  return s;
}

}  // namespace fastps
