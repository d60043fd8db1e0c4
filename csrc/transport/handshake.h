// Challenge-response that proves a data connection belongs to the job without
// sending the token: the server sends a fresh nonce, the worker answers with
// HMAC(token, nonce || job_id || rank).
#pragma once
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

#include "transport/wire.h"

namespace fastps {

struct Peer {
  uint32_t rank = 0;
  uint32_t conn_index = 0;
};

// Server side. Returns false (and fills *why) if the peer fails to prove itself
// within timeout_s; the caller closes the socket.
bool accept_handshake(int fd, const std::string& job_id, const std::string& token,
                      uint32_t num_workers, double timeout_s, Peer* peer, std::string* why);
// Worker side. Throws std::runtime_error if the server refuses or times out, and
// HandshakeBusy if the server turned the connection away for load (retry it).
void connect_handshake(int fd, const std::string& job_id, const std::string& token, uint32_t rank,
                       uint32_t conn_index, double timeout_s, const std::string& server_desc);

struct HandshakeBusy : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// tcp_connect + connect_handshake, reconnecting after a load refusal (HandshakeBusy)
// until timeout_s. Returns the authenticated socket; throws std::runtime_error.
// cancelled (optional) is polled while retrying: a non-empty answer (the job
// aborted) is thrown at once instead of waiting out the timeout.
int connect_authenticated(const std::string& addr, const std::string& job_id,
                          const std::string& token, uint32_t rank, uint32_t conn_index,
                          double timeout_s, int notsent_lowat, const std::string& server_desc,
                          const std::function<std::string()>& cancelled = nullptr);

// Server side, non-blocking: one per accepted socket, driven by the caller's poll
// loop, so any number of silent or slow peers cannot delay the others.
class ServerHandshake {
 public:
  enum class State { kPending, kDone, kFailed };
  // Sends the challenge (a few bytes: always fits a fresh socket's buffer).
  ServerHandshake(int fd, double deadline_s);
  // Reads what arrived and, once the whole hello is in, checks it.
  State on_readable(const std::string& job_id, const std::string& token, uint32_t num_workers);
  int fd() const { return fd_; }
  double deadline() const { return deadline_; }
  const Peer& peer() const { return peer_; }
  const std::string& why() const { return why_; }

 private:
  State fail(std::string why);
  int fd_;
  double deadline_;
  Challenge ch_{};
  Hello hello_{};
  size_t got_ = 0;
  Peer peer_;
  std::string why_;
};

// Turns a connection away for load: the peer reads a busy marker instead of a challenge.
void refuse_busy(int fd);

}  // namespace fastps
