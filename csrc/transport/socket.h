// Thin, timeout-bounded helpers over POSIX TCP sockets.
#pragma once
#include <cstddef>
#include <string>

namespace fastps {

// "host:port" -> connected blocking socket with TCP_NODELAY. Retries refused
// connections until timeout_s; throws std::runtime_error naming the address.
// notsent_lowat > 0 sets TCP_NOTSENT_LOWAT (see tune_socket).
int tcp_connect(const std::string& addr, double timeout_s, int notsent_lowat = 0);
// Listening socket on host:port (port 0 picks one); returns fd, sets *bound_port.
int tcp_listen(const std::string& host, int port, int* bound_port);
// Local stream sockets in Linux's abstract namespace ("@name"): no file to
// clean up, and the name vanishes with the listening process.
int unix_listen(const std::string& name);
// Retries until the peer listens or timeout_s passes; throws std::runtime_error.
int unix_connect(const std::string& name, double timeout_s);
void set_nonblocking(int fd, bool on);
void tune_socket(int fd, int notsent_lowat = 0);
// Caps the rate at which the kernel sends on fd (SO_MAX_PACING_RATE, bytes/s;
// <= 0: no cap). Pacing each flow at its share of a host's link keeps the
// link's queue short and splits it by the bytes each flow must carry rather
// than evenly per connection.
void set_pacing_rate(int fd, double bytes_per_s);

// A connection with data in flight that has sat through min_backoff retransmission
// timeouts in a row gets its congestion control restarted (switched to reno and back),
// so that it measures the path afresh once the path is back. Returns whether it did.
// For BBR: after a link outage its bandwidth estimate can collapse to ~1 Mbit/s and,
// with a round lasting a timeout, stay there for ~10 s (see the definition).
bool restart_stuck_congestion_control(int fd, int min_backoff);
// Reads/writes exactly len bytes on a blocking or non-blocking fd, waiting at
// most timeout_s overall. Return false on timeout, EOF or error.
bool read_full(int fd, void* buf, size_t len, double timeout_s);
bool write_full(int fd, const void* buf, size_t len, double timeout_s);
std::string peer_name(int fd);
void split_addr(const std::string& addr, std::string* host, int* port);

}  // namespace fastps
