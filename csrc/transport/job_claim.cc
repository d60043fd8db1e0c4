#include "transport/job_claim.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <stdexcept>

namespace fastps {

JobClaim::JobClaim(const std::string& job_id, uint32_t rank) {
  std::string name = "fastps-" + job_id + "-claim-w" + std::to_string(rank);
  sockaddr_un sa{};
  if (name.size() + 1 > sizeof(sa.sun_path))
    throw std::invalid_argument("job id '" + job_id + "' is too long");
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract
  auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw std::runtime_error(std::string("socket(AF_UNIX): ") + strerror(errno));
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&sa), len) == 0) return;
  int err = errno;
  ::close(fd_);
  fd_ = -1;
  if (err == EADDRINUSE)
    throw std::runtime_error(
        "job id '" + job_id + "' is already in use on this host: another live process holds " +
        "worker rank " + std::to_string(rank) + "'s claim (@" + name +
        "); give each job its own FASTPS_JOB_ID (standalone roles default to job<scheduler "
        "port>, so two schedulers on the same port collide)");
  throw std::runtime_error("cannot claim @" + name + ": " + strerror(err));
}

JobClaim::~JobClaim() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace fastps
