#include "compression/error_feedback.h"

namespace fastps {

float* ErrorFeedback::residual(uint64_t key, size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& r = residual_[key];
  if (r.size() != n) r.assign(n, 0.0f);
  return r.data();
}

float* ErrorFeedback::velocity(uint64_t key, size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& v = velocity_[key];
  if (v.size() != n) v.assign(n, 0.0f);
  return v.data();
}

void ErrorFeedback::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  residual_.clear();
  velocity_.clear();
}

size_t ErrorFeedback::parts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return residual_.size();
}

}  // namespace fastps
