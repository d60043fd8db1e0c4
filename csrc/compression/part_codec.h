// A compressed part as it travels: CompressedHeader, then the codec's body. The worker
// encodes each part before the push and decodes the server's answer into the output;
// the server decodes every pusher's part into a float32 sum and encodes the sum. Parts
// of float32, float64, float16 and bfloat16 tensors; the codecs see float32.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "compression/compressor.h"
#include "compression/error_feedback.h"

namespace fastps {

// Whether tensors of dt can be compressed.
bool compressible(DType dt);
void to_float(const void* src, DType dt, size_t n, float* dst);
void from_float(const float* src, size_t n, DType dt, void* dst);

// The largest payload a compressed part of `elements` values can be (any codec): what
// a receiver may accept before reading the header.
uint64_t max_compressed_bytes(uint64_t elements);

// The bytes a compressed part of n values takes on the wire (header and body), without
// encoding it: what the push scheduler's credit and window count for it.
uint64_t compressed_bytes(const CompressionSpec& spec, size_t n);

// Encodes n values of dtype dt at in. With error feedback (ef != nullptr) the residual
// of key is added first and what the encoding drops becomes the new residual.
// Returns header + body.
std::shared_ptr<std::vector<char>> encode_part(const CompressionSpec& spec, const void* in,
                                               DType dt, size_t n, uint64_t seed, ErrorFeedback* ef,
                                               uint64_t key);

// A compressed payload's header, checked: magic, a known codec, no unknown flag, a
// momentum only on top-k with error feedback.
// Throws std::invalid_argument saying what is wrong.
CompressedHeader read_compressed_header(const char* data, size_t len);
CompressionSpec spec_of(const CompressedHeader& h);

// Decodes a compressed payload of `len` bytes holding `n` values into out (n floats),
// or adds them to it (add = true). Throws std::invalid_argument if the payload is not
// a valid encoding of n values.
void decode_part(const char* data, size_t len, size_t n, float* out, bool add);

// The seed of a part's round: random-k must draw the same indices on every pusher, so
// it depends on the part and the round only; dithering's draws differ per pusher (salt).
uint64_t round_seed(const CompressionSpec& spec, uint64_t key, uint64_t round, uint32_t salt);

}  // namespace fastps
