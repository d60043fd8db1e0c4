// A host-wide, exclusive claim on one worker rank of one job id, held for the
// life of the process: an abstract unix socket name, which the kernel frees
// when the process dies (nothing to clean up after a crash). A second job that
// runs with the same job id on the same host fails at start naming the clash,
// instead of mapping the first job's shared memory.
#pragma once
#include <cstdint>
#include <string>

namespace fastps {

class JobClaim {
 public:
  // Throws std::runtime_error naming the job id and rank if another live
  // process holds the claim.
  JobClaim(const std::string& job_id, uint32_t rank);
  ~JobClaim();
  JobClaim(const JobClaim&) = delete;
  JobClaim& operator=(const JobClaim&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace fastps
