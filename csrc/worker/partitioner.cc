#include "worker/partitioner.h"

#include <cmath>
#include <numeric>
#include <stdexcept>

namespace fastps {

Partitioner::Partitioner(size_t partition_bytes, std::vector<double> weights)
    : partition_bytes_(partition_bytes), weights_(std::move(weights)) {
  if (partition_bytes_ == 0) throw std::invalid_argument("partition_bytes must be > 0");
  if (weights_.empty()) return;
  double total = 0;
  for (double w : weights_) {
    if (!(w >= 0)) throw std::invalid_argument("server weights must be >= 0");
    total += w;
  }
  if (!(total > 0)) throw std::invalid_argument("at least one server weight must be > 0");
  total_weight_ = total;
  // Pattern length: enough slots that each server's share is within 1% of its weight.
  size_t len = std::max<size_t>(weights_.size(), 100 * weights_.size());
  std::vector<double> current(weights_.size(), 0.0);
  pattern_.reserve(len);
  for (size_t i = 0; i < len; ++i) {
    size_t best = 0;
    for (size_t s = 0; s < weights_.size(); ++s) {
      current[s] += weights_[s] / total;
      if (current[s] > current[best]) best = s;
    }
    current[best] -= 1.0;
    pattern_.push_back(static_cast<uint32_t>(best));
  }
}

std::vector<PartSpan> Partitioner::split(uint64_t tensor_id, size_t nbytes,
                                         size_t elem_size) const {
  std::vector<PartSpan> parts;
  if (nbytes == 0) return parts;
  size_t step = std::max(elem_size, partition_bytes_ / elem_size * elem_size);
  size_t start = pattern_.empty() ? 0 : (tensor_id >> 11) % pattern_.size();
  uint32_t idx = 0;
  // Small tensors go whole to one server picked by walking the weighted pattern from a
  // hashed start; they carry few bytes in total, so they barely skew the balance.
  if (nbytes < slice_threshold() || weights_.size() <= 1) {
    for (size_t off = 0; off < nbytes; off += step, ++idx) {
      uint32_t server = pattern_.empty() ? 0 : pattern_[(start + idx) % pattern_.size()];
      parts.push_back(PartSpan{idx, off, std::min(step, nbytes - off), server});
    }
    return parts;
  }
  // Larger tensors are cut into one slice per server sized exactly by its weight, so the
  // bytes each server sums match the optimal split whatever the tensor sizes are.
  size_t elems = nbytes / elem_size;
  size_t first = (tensor_id >> 17) % weights_.size();  // rotate who gets the front
  size_t off = 0;
  double acc = 0.0;
  for (size_t i = 0; i < weights_.size(); ++i) {
    size_t s = (first + i) % weights_.size();
    acc += weights_[s] / total_weight_;
    size_t end = i + 1 == weights_.size()
                     ? nbytes
                     : std::min(nbytes, static_cast<size_t>(std::llround(acc * elems)) * elem_size);
    for (; off < end; off += std::min(step, end - off), ++idx)
      parts.push_back(PartSpan{idx, off, std::min(step, end - off), static_cast<uint32_t>(s)});
  }
  return parts;
}

}  // namespace fastps
