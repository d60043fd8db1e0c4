// Cuts tensors into parts and assigns each part a server. The assignment is a
// pure function of (tensor id, part index, server weights), so every worker
// computes the same one without coordination, whatever order tensors arrive in.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace fastps {

struct PartSpan {
  uint32_t index;
  size_t offset;
  size_t len;
  uint32_t server;
};

class Partitioner {
 public:
  // weights: relative share of bytes each server should receive (>= 0, not all 0).
  Partitioner(size_t partition_bytes, std::vector<double> weights);
  std::vector<PartSpan> split(uint64_t tensor_id, size_t nbytes, size_t elem_size) const;
  size_t num_servers() const { return weights_.size(); }
  const std::vector<uint32_t>& pattern() const { return pattern_; }
  // Tensors at least this large are sliced across all servers by weight.
  size_t slice_threshold() const { return std::max<size_t>(64 << 10, partition_bytes_ / 4); }

 private:
  size_t partition_bytes_;
  std::vector<double> weights_;
  double total_weight_ = 0.0;
  // Smooth weighted round-robin sequence: consecutive parts of a tensor walk
  // it, so a large tensor's bytes split across servers in weight proportion.
  std::vector<uint32_t> pattern_;
};

}  // namespace fastps
