// Local SGD and DiLoCo with the outer optimizer on the summation servers
// (docs/guide/local-sgd.md). Workers take H local steps, then push the change of their
// parameters since the last outer step (their delta); the server averages the n deltas of
// the round and applies the outer optimizer, whose state it keeps per part:
//   g = -mean(delta)                (the "outer gradient": the averaged step, reversed)
//   m = momentum * m + g            (m = 0 before the first round)
//   u = nesterov ? g + momentum * m : m
//   params -= lr * u
// lr 1 and momentum 0 is plain model averaging (local SGD); DiLoCo uses SGD with Nesterov
// momentum (lr 0.7, momentum 0.9 in the paper). This is torch.optim.SGD's rule (dampening 0)
// applied to g, in float64 whatever the parameters' dtype.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace fastps {

struct OuterConfig {
  double lr = 1.0;
  double momentum = 0.0;
  bool nesterov = false;
};

// Empty when `c` can be used, else why, naming the value ("outer learning rate nan ...").
std::string outer_config_error(const OuterConfig& c);

class OuterOptimizer {
 public:
  // Throws std::invalid_argument with outer_config_error's text.
  explicit OuterOptimizer(const OuterConfig& c);
  // One outer step of `count` parameters: `params` (float64) move by the rule above, given
  // the mean of the workers' deltas (their parameters minus `params` before the step).
  void step(double* params, const double* mean_delta, size_t count);
  const OuterConfig& config() const { return cfg_; }
  // The momentum buffer (empty until the first step, and always without momentum).
  const std::vector<double>& momentum_buffer() const { return buf_; }
  uint64_t steps() const { return steps_; }

 private:
  OuterConfig cfg_;
  std::vector<double> buf_;
  uint64_t steps_ = 0;
};

// The dtypes whose parameters an outer optimizer updates (the float types).
bool outer_dtype_ok(DType dt);
// acc[i] += src[i] (src of dtype dt), and out[i] = src[i], in float64.
void add_as_double(const void* src, DType dt, size_t count, double* acc);
void to_double(const void* src, DType dt, size_t count, double* out);
// out[i] = src[i] rounded to dtype dt (to nearest, ties to even).
void from_double(const double* src, size_t count, DType dt, void* out);

}  // namespace fastps
