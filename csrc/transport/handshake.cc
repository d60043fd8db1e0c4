#include "transport/handshake.h"

#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "common/hmac_sha256.h"
#include "transport/socket.h"
#include "transport/wire.h"

namespace fastps {
namespace {

Digest expected_mac(const uint8_t* nonce, const std::string& job_id, const std::string& token,
                    uint32_t rank) {
  std::vector<uint8_t> msg(nonce, nonce + kNonceBytes);
  msg.insert(msg.end(), job_id.begin(), job_id.end());
  for (int i = 0; i < 4; ++i) msg.push_back(static_cast<uint8_t>(rank >> (8 * i)));
  return hmac_sha256(token.data(), token.size(), msg.data(), msg.size());
}

}  // namespace

bool accept_handshake(int fd, const std::string& job_id, const std::string& token,
                      uint32_t num_workers, double timeout_s, Peer* peer, std::string* why) {
  Challenge ch{};
  ch.magic = kChallengeMagic;
  std::random_device rd;
  for (size_t i = 0; i < kNonceBytes; i += 4) {
    uint32_t r = rd();
    std::memcpy(ch.nonce + i, &r, 4);
  }
  if (!write_full(fd, &ch, sizeof(ch), timeout_s)) {
    *why = "could not send challenge";
    return false;
  }
  Hello hello{};
  if (!read_full(fd, &hello, sizeof(hello), timeout_s)) {
    *why = "no valid hello within timeout";
    return false;
  }
  if (hello.magic != kHelloMagic) {
    *why = "garbage instead of hello";
    return false;
  }
  if (hello.rank >= num_workers) {
    *why = "claims rank " + std::to_string(hello.rank) + " but the job has " +
           std::to_string(num_workers) + " workers";
    return false;
  }
  Digest want = expected_mac(ch.nonce, job_id, token, hello.rank);
  Digest got;
  std::memcpy(got.data(), hello.mac, 32);
  if (!digest_equal(want, got)) {
    *why = "bad token proof";
    return false;
  }
  uint8_t ok = 1;
  if (!write_full(fd, &ok, 1, timeout_s)) {
    *why = "closed after hello";
    return false;
  }
  peer->rank = hello.rank;
  peer->conn_index = hello.conn_index;
  return true;
}

void connect_handshake(int fd, const std::string& job_id, const std::string& token,
                       uint32_t rank, uint32_t conn_index, double timeout_s,
                       const std::string& server_desc) {
  Challenge ch{};
  if (!read_full(fd, &ch, sizeof(ch), timeout_s) || ch.magic != kChallengeMagic)
    throw std::runtime_error("no challenge from " + server_desc);
  Hello hello{};
  hello.magic = kHelloMagic;
  hello.rank = rank;
  hello.conn_index = conn_index;
  Digest mac = expected_mac(ch.nonce, job_id, token, rank);
  std::memcpy(hello.mac, mac.data(), 32);
  uint8_t ok = 0;
  if (!write_full(fd, &hello, sizeof(hello), timeout_s) || !read_full(fd, &ok, 1, timeout_s) ||
      ok != 1)
    throw std::runtime_error(server_desc +
                             " refused this worker's token (is FASTPS_TOKEN/FASTPS_JOB_ID the "
                             "same for every process of the job?)");
}

}  // namespace fastps
