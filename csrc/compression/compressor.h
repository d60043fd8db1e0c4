// Gradient compressors (docs/guide/compression.md): the interface every codec implements, the
// settings a tensor is compressed with, and the header that opens every compressed
// payload on the wire. Codecs work on float32 values; compression/convert turns the
// tensor's own dtype into float32 and back. Nothing here knows about sockets or servers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace fastps {

// Wire values: fixed, add new codecs only at the end.
enum class Codec : uint8_t {
  kNone = 0,
  kFP16 = 1,       // float16 values
  kBF16 = 2,       // bfloat16 values
  kOneBit = 3,     // signs and one scale (mean |x|)
  kTopK = 4,       // the k largest |x| with their indices
  kRandomK = 5,    // k values at indices drawn from a seed every pusher shares
  kDithering = 6,  // stochastic rounding to `levels` levels of max |x|
  kCount = 7,
};

// "fp16", "topk", ...: the name a codec has in CompressionSpec's text form ("?" if unknown).
const char* codec_name(Codec c);

// How one tensor is compressed. param: k for top-k/random-k (a fraction of the part's
// elements when < 1, else a count), the number of levels for dithering; unused otherwise.
// momentum: top-k's momentum correction (Lin et al. 2018, "Deep Gradient Compression"),
// the factor m in [0.0001, 0.9999] in steps of 0.0001 (it travels as a 16-bit count), or 0.
// warmup: Deep Gradient Compression's sparsity warm-up (Lin et al. 2018, section 3.3) for a
// fractional top-k / random-k, in rounds of the part: the kept fraction falls
// exponentially from all values to k in kWarmupStages equal stages (at_round); 0: none.
// It never travels: each round's header carries the fraction that round used.
struct CompressionSpec {
  Codec codec = Codec::kNone;
  float param = 0.0f;
  bool error_feedback = false;
  float momentum = 0.0f;
  uint32_t warmup = 0;

  bool enabled() const { return codec != Codec::kNone; }
  bool operator==(const CompressionSpec& o) const {
    return codec == o.codec && param == o.param && error_feedback == o.error_feedback &&
           momentum == o.momentum && warmup == o.warmup;
  }
  // The settings of a part's round `round` (counted from 0): during the warm-up, stage
  // s = round * kWarmupStages / warmup keeps the fraction k^((s+1)/(kWarmupStages+1))
  // (DGC's 75%, 93.75%, ... sparsity, ending at k), and warmup is 0 in the result.
  CompressionSpec at_round(uint64_t round) const;
  bool operator!=(const CompressionSpec& o) const { return !(*this == o); }
  // The canonical text form, the one parse() reads: "none", "fp16", "bf16", "onebit",
  // "topk:0.01", "randomk:0.01", "dithering:16", each optionally followed by ":ef"; top-k
  // with error feedback then optionally by ":momentum=0.9"; a fractional top-k or
  // random-k last optionally by ":warmup=ROUNDS".
  std::string describe() const;
  // Throws std::invalid_argument naming the bad text or value.
  static CompressionSpec parse(const std::string& text);
};

// Opens every compressed payload. The frame header keeps the tensor's own dtype and
// tensor_bytes; this says how the part was compressed, so a server can check that every
// pusher of a round used the same settings and decode each part.
struct CompressedHeader {
  uint32_t magic;     // kCompressedMagic
  uint8_t codec;      // Codec
  uint8_t flags;      // kCompressedErrorFeedback
  uint16_t momentum;  // CompressionSpec::momentum in units of 1e-4 (0: none)
  uint32_t elements;  // the part's element count, uncompressed
  float param;        // CompressionSpec::param
  uint64_t seed;      // random-k's indices and dithering's rounding draw from it
};
static_assert(sizeof(CompressedHeader) == 24, "compressed header layout");
constexpr uint32_t kWarmupStages = 4;              // DGC's: 75%, 93.75%, 98.4375%, 99.6% sparsity
constexpr uint32_t kCompressedMagic = 0x43535046;  // "FPSC"
constexpr uint8_t kCompressedErrorFeedback = 1;

// One codec. compress() writes the body (after the header) and returns its length, at
// most max_body(n); decompress() checks that `bytes` is exactly what this codec writes for
// n elements (throws std::invalid_argument otherwise, never reads past the body) and
// writes all n values. decompress_add() adds them to acc instead.
class Compressor {
 public:
  virtual ~Compressor() = default;
  virtual size_t max_body(size_t n) const = 0;
  virtual size_t compress(const float* x, size_t n, uint64_t seed, char* body) const = 0;
  virtual void decompress(const char* body, size_t bytes, size_t n, uint64_t seed,
                          float* out) const = 0;
  virtual void decompress_add(const char* body, size_t bytes, size_t n, uint64_t seed,
                              float* acc) const;
  // Error feedback in place: compresses c like compress() and leaves in c what the body
  // does not carry, c - decompress(body). The codecs override it to skip the decode.
  virtual size_t compress_residual(float* c, size_t n, uint64_t seed, char* body) const;
  // Zeroes v at every index a body carries (momentum factor masking); a dense codec
  // carries them all. Called on bodies this process encoded.
  virtual void zero_sent(const char* body, size_t bytes, size_t n, uint64_t seed, float* v) const;
};

// CompressionSpec::momentum <-> its header field.
uint16_t momentum_units(float momentum);
float momentum_of_units(uint16_t units);

// The codec for spec (spec.enabled() must hold); throws std::invalid_argument for a bad param.
std::unique_ptr<Compressor> make_compressor(const CompressionSpec& spec);

// k of top-k / random-k for a part of n elements: ceil(param * n) when param < 1 (a
// product within float32's precision of a whole number counts as that number: 0.05f * 640
// is 32), else param; at least 1 and at most n.
size_t sparse_k(float param, size_t n);

// A counter-based random stream (splitmix64 of seed + (i + 1) * golden ratio): the same
// numbers on every process for the same seed, and any element computable on its own.
uint64_t random_at(uint64_t seed, uint64_t i);

// The random-k indices for (seed, n, k): k distinct indices < n in ascending order.
void randomk_indices(uint64_t seed, size_t n, size_t k, uint32_t* out);

}  // namespace fastps
