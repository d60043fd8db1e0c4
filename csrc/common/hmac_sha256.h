// HMAC-SHA256 for the challenge-response that proves a connection belongs to a
// job. Matches Python's hmac.new(key, msg, hashlib.sha256).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace fastps {

using Digest = std::array<uint8_t, 32>;

Digest sha256(const void* data, size_t len);
Digest hmac_sha256(const void* key, size_t key_len, const void* msg, size_t msg_len);
// Compares in time independent of where the inputs differ.
bool digest_equal(const Digest& a, const Digest& b);
std::string to_hex(const Digest& d);

}  // namespace fastps
