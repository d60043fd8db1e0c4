// Challenge-response that proves a data connection belongs to the job without
// sending the token: the server sends a fresh nonce, the worker answers with
// HMAC(token, nonce || job_id || rank).
#pragma once
#include <cstdint>
#include <string>

namespace fastps {

struct Peer {
  uint32_t rank = 0;
  uint32_t conn_index = 0;
};

// Server side. Returns false (and fills *why) if the peer fails to prove itself
// within timeout_s; the caller closes the socket.
bool accept_handshake(int fd, const std::string& job_id, const std::string& token,
                      uint32_t num_workers, double timeout_s, Peer* peer, std::string* why);
// Worker side. Throws std::runtime_error if the server refuses or times out.
void connect_handshake(int fd, const std::string& job_id, const std::string& token,
                       uint32_t rank, uint32_t conn_index, double timeout_s,
                       const std::string& server_desc);

}  // namespace fastps
