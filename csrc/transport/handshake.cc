#include "transport/handshake.h"

#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/errors.h"
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

namespace {
void fill_nonce(uint8_t* nonce) {
  std::random_device rd;
  for (size_t i = 0; i < kNonceBytes; i += 4) {
    uint32_t r = rd();
    std::memcpy(nonce + i, &r, 4);
  }
}

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}
}  // namespace

ServerHandshake::ServerHandshake(int fd, double deadline_s) : fd_(fd), deadline_(deadline_s) {
  ch_.magic = kChallengeMagic;
  fill_nonce(ch_.nonce);
  ssize_t n = ::send(fd_, &ch_, sizeof(ch_), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n != static_cast<ssize_t>(sizeof(ch_))) why_ = "could not send challenge";
}

ServerHandshake::State ServerHandshake::fail(std::string why) {
  why_ = std::move(why);
  return State::kFailed;
}

ServerHandshake::State ServerHandshake::on_readable(const std::string& job_id,
                                                    const std::string& token,
                                                    uint32_t num_workers) {
  if (!why_.empty()) return State::kFailed;
  while (got_ < sizeof(hello_)) {
    ssize_t n =
        ::recv(fd_, reinterpret_cast<char*>(&hello_) + got_, sizeof(hello_) - got_, MSG_DONTWAIT);
    if (n == 0) return fail("closed during the handshake");
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return State::kPending;
      return fail(std::string("receive failed during the handshake: ") + strerror(errno));
    }
    got_ += static_cast<size_t>(n);
    // The magic arrives first: refuse garbage without waiting for the rest.
    if (got_ >= sizeof(hello_.magic) && hello_.magic != kHelloMagic)
      return fail("garbage instead of hello");
  }
  if (hello_.rank >= num_workers)
    return fail("claims rank " + std::to_string(hello_.rank) + " but the job has " +
                std::to_string(num_workers) + " workers");
  Digest want = expected_mac(ch_.nonce, job_id, token, hello_.rank);
  Digest got;
  std::memcpy(got.data(), hello_.mac, 32);
  if (!digest_equal(want, got)) return fail("bad token proof");
  uint8_t ok = 1;
  if (::send(fd_, &ok, 1, MSG_DONTWAIT | MSG_NOSIGNAL) != 1) return fail("closed after hello");
  peer_.rank = hello_.rank;
  peer_.conn_index = hello_.conn_index;
  return State::kDone;
}

void refuse_busy(int fd) {
  Challenge busy{};
  busy.magic = kBusyMagic;
  (void)!::send(fd, &busy, sizeof(busy), MSG_DONTWAIT | MSG_NOSIGNAL);
}

int connect_authenticated(const std::string& addr, const std::string& job_id,
                          const std::string& token, uint32_t rank, uint32_t conn_index,
                          double timeout_s, int notsent_lowat, const std::string& server_desc,
                          const std::function<std::string()>& cancelled) {
  double deadline = now_s() + timeout_s;
  double backoff = 0.01;
  auto check = [&] {
    std::string why = cancelled ? cancelled() : std::string();
    if (!why.empty()) throw AbortError(why);
  };
  while (true) {
    // Connect in short slices, so an abort is noticed while the server is not up (yet).
    int fd = -1;
    std::string last;
    while (fd < 0) {
      check();
      double left = deadline - now_s();
      if (left <= 0)
        throw TimeoutError("cannot connect to " + server_desc + " within " +
                           std::to_string(timeout_s) + " s: " + last);
      try {
        fd = tcp_connect(addr, std::min(left, 0.25), notsent_lowat);
      } catch (const std::runtime_error& e) {
        last = e.what();
      }
    }
    try {
      connect_handshake(fd, job_id, token, rank, conn_index, std::max(0.001, deadline - now_s()),
                        server_desc);
      return fd;
    } catch (const HandshakeBusy& e) {
      ::close(fd);
      if (now_s() + backoff >= deadline)
        throw TimeoutError(std::string(e.what()) + "; gave up after " + std::to_string(timeout_s) +
                           " s");
      std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
      backoff = std::min(backoff * 2, 0.5);
    } catch (...) {
      ::close(fd);
      throw;
    }
  }
}

bool accept_handshake(int fd, const std::string& job_id, const std::string& token,
                      uint32_t num_workers, double timeout_s, Peer* peer, std::string* why) {
  Challenge ch{};
  ch.magic = kChallengeMagic;
  fill_nonce(ch.nonce);
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

void connect_handshake(int fd, const std::string& job_id, const std::string& token, uint32_t rank,
                       uint32_t conn_index, double timeout_s, const std::string& server_desc) {
  Challenge ch{};
  if (!read_full(fd, &ch, sizeof(ch), timeout_s))
    throw std::runtime_error("no challenge from " + server_desc);
  if (ch.magic == kBusyMagic)
    throw HandshakeBusy(server_desc +
                        " refused the connection for load (too many handshakes "
                        "under way)");
  if (ch.magic != kChallengeMagic) throw std::runtime_error("no challenge from " + server_desc);
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
