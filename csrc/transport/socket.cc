#include "transport/socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "common/errors.h"

// Linux 6.15's cap on the retransmission timeout's backoff; older headers lack the name.
#ifndef TCP_RTO_MAX_MS
#define TCP_RTO_MAX_MS 44
#endif

namespace fastps {
namespace {

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

bool wait_fd(int fd, short events, double deadline) {
  while (true) {
    double left = deadline - now_s();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, static_cast<int>(left * 1000) + 1);
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return false;
  }
}

}  // namespace

void split_addr(const std::string& addr, std::string* host, int* port) {
  auto pos = addr.rfind(':');
  if (pos == std::string::npos) throw std::invalid_argument("address '" + addr + "' has no port");
  *host = addr.substr(0, pos);
  *port = std::stoi(addr.substr(pos + 1));
}

void set_nonblocking(int fd, bool on) {
  int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

void tune_socket(int fd, int notsent_lowat) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // Large socket buffers keep a whole part in flight on fast links.
  int buf = 8 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
  // Few unsent bytes in the kernel: the rest waits in user space, where the
  // scheduler can still put an urgent part ahead of it.
  if (notsent_lowat > 0)
    setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &notsent_lowat, sizeof(notsent_lowat));
  // After a link outage TCP retransmits with a timeout that doubles each time, up to 120 s
  // by default: a retransmission that falls into a second outage of a flapping link left a
  // job waiting 15.7 s after the link was back (tests/rack/test_flaky_link.py). Capped at
  // the smallest value Linux allows (1 s), a connection resumes within a second of a heal.
  // Kernels before 6.15 refuse the option; they keep their own backoff.
  int rto_max_ms = 1000;
  setsockopt(fd, IPPROTO_TCP, TCP_RTO_MAX_MS, &rto_max_ms, sizeof(rto_max_ms));
}

// Seen on the emulated rack (tests/rack/test_flaky_link.py, `ss -ti` on the sender): after
// a 2 s outage a server's answer connection under BBR paced at 1.04 Mbit/s with a
// congestion window of 4, each round ended by a retransmission timeout (backoff 1, 2, ...
// 10), and BBR keeps the largest bandwidth of its last ten rounds: the job waited 12 s for
// 20 KB; with cubic the next round came within 1.7 s of every heal (5 runs). Setting the
// same algorithm again is a no-op in Linux, so the restart goes through reno (always
// built in).
bool restart_stuck_congestion_control(int fd, int min_backoff) {
  tcp_info ti{};
  socklen_t len = sizeof(ti);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return false;
  if (ti.tcpi_unacked == 0 || ti.tcpi_backoff < min_backoff) return false;
  char name[32] = {};
  socklen_t nlen = sizeof(name) - 1;
  if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &nlen) != 0) return false;
  if (std::strcmp(name, "reno") == 0) return false;  // nothing to go through
  static const char kReno[] = "reno";
  if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, kReno, sizeof(kReno) - 1) != 0) return false;
  return setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, std::strlen(name)) == 0;
}

void set_pacing_rate(int fd, double bytes_per_s) {
  // The option takes an unsigned int; ~0U means unpaced, and rates past 4 GB/s
  // are as good as unpaced.
  unsigned int rate = ~0U;
  if (bytes_per_s > 0 && bytes_per_s < 4.0e9) rate = static_cast<unsigned int>(bytes_per_s);
  setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &rate, sizeof(rate));
}

static sockaddr_in resolve(const std::string& host, int port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (host.empty() || host == "0.0.0.0") {
    sa.sin_addr.s_addr = INADDR_ANY;
  } else if (inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    addrinfo* res = nullptr;
    if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res)
      throw std::runtime_error("cannot resolve host '" + host + "'");
    sa.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
    freeaddrinfo(res);
  }
  return sa;
}

int tcp_connect(const std::string& addr, double timeout_s, int notsent_lowat) {
  std::string host;
  int port = 0;
  split_addr(addr, &host, &port);
  sockaddr_in sa = resolve(host, port);
  double deadline = now_s() + timeout_s;
  std::string last_err = "timed out";
  while (now_s() < deadline) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error(std::string("socket(): ") + strerror(errno));
    tune_socket(fd, notsent_lowat);
    set_nonblocking(fd, true);
    int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
    if (rc != 0 && errno == EINPROGRESS) {
      if (wait_fd(fd, POLLOUT, deadline)) {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      set_nonblocking(fd, false);
      return fd;
    }
    last_err = strerror(errno);
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  throw TimeoutError("cannot connect to " + addr + " within " + std::to_string(timeout_s) +
                     " s: " + last_err);
}

int tcp_listen(const std::string& host, int port, int* bound_port) {
  sockaddr_in sa = resolve(host, port);
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket(): ") + strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    std::string err = strerror(errno);
    ::close(fd);
    throw std::runtime_error("cannot bind " + host + ":" + std::to_string(port) + ": " + err);
  }
  if (::listen(fd, 256) != 0) {
    ::close(fd);
    throw std::runtime_error(std::string("listen(): ") + strerror(errno));
  }
  socklen_t len = sizeof(sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  *bound_port = ntohs(sa.sin_port);
  return fd;
}

static socklen_t abstract_addr(const std::string& name, sockaddr_un* sa) {
  if (name.size() + 1 > sizeof(sa->sun_path))
    throw std::invalid_argument("local socket name '" + name + "' is too long");
  *sa = sockaddr_un{};
  sa->sun_family = AF_UNIX;
  std::memcpy(sa->sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

int unix_listen(const std::string& name) {
  sockaddr_un sa;
  socklen_t len = abstract_addr(name, &sa);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket(AF_UNIX): ") + strerror(errno));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), len) != 0 || ::listen(fd, 64) != 0) {
    std::string err = strerror(errno);
    ::close(fd);
    throw std::runtime_error("cannot listen on local socket @" + name + ": " + err);
  }
  return fd;
}

int unix_connect(const std::string& name, double timeout_s) {
  sockaddr_un sa;
  socklen_t len = abstract_addr(name, &sa);
  double deadline = now_s() + timeout_s;
  std::string last_err = "timed out";
  while (now_s() < deadline) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error(std::string("socket(AF_UNIX): ") + strerror(errno));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), len) == 0) {
      int buf = 1 << 20;
      setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
      return fd;
    }
    last_err = strerror(errno);
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  throw TimeoutError("cannot connect to local socket @" + name + " within " +
                     std::to_string(timeout_s) + " s: " + last_err);
}

bool read_full(int fd, void* buf, size_t len, double timeout_s) {
  double deadline = now_s() + timeout_s;
  char* p = static_cast<char*>(buf);
  while (len > 0) {
    ssize_t n = ::recv(fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
    } else if (n == 0) {
      return false;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (!wait_fd(fd, POLLIN, deadline)) return false;
    } else {
      return false;
    }
  }
  return true;
}

bool write_full(int fd, const void* buf, size_t len, double timeout_s) {
  double deadline = now_s() + timeout_s;
  const char* p = static_cast<const char*>(buf);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (!wait_fd(fd, POLLOUT, deadline)) return false;
    } else {
      return false;
    }
  }
  return true;
}

std::string peer_name(int fd) {
  sockaddr_in sa{};
  socklen_t len = sizeof(sa);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) return "?";
  char ip[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
  return std::string(ip) + ":" + std::to_string(ntohs(sa.sin_port));
}

}  // namespace fastps
