// Error feedback (Seide et al. 2014; Karimireddy et al. 2019, "EF-SGD"): what a
// compression dropped from a part is added to that part's next round before it is
// compressed again, so nothing is lost, only delayed. One residual per part key; a part
// whose element count changed (repartitioned, reshaped) starts from zero.
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace fastps {

class ErrorFeedback {
 public:
  // The residual of key, n values (zeros when new or of another length). The caller adds
  // the round's input to it and compresses it in place (Compressor::compress_residual),
  // which leaves the next round's residual there. The memory stays valid until clear();
  // only one thread may use a key's residual at a time (the push thread, an engine).
  float* residual(uint64_t key, size_t n);
  // Top-k's momentum correction: the velocity of key, n values, kept like the residual.
  float* velocity(uint64_t key, size_t n);
  // Forgets every residual (the job's membership changed: parts mean other things now).
  void clear();
  size_t parts() const;

 private:
  mutable std::mutex mu_;  // a leaf lock
  std::unordered_map<uint64_t, std::vector<float>> residual_;
  std::unordered_map<uint64_t, std::vector<float>> velocity_;
};

}  // namespace fastps
