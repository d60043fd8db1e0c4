#include "server/outer_optimizer.h"

#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "kernels/half.h"

namespace fastps {

std::string outer_config_error(const OuterConfig& c) {
  std::ostringstream os;
  if (!std::isfinite(c.lr) || c.lr <= 0) {
    os << "outer learning rate " << c.lr << " is not a finite number > 0";
  } else if (!std::isfinite(c.momentum) || c.momentum < 0 || c.momentum >= 1) {
    // momentum >= 1 makes the buffer grow without bound instead of averaging past steps.
    os << "outer momentum " << c.momentum << " is not in [0, 1)";
  }
  return os.str();
}

OuterOptimizer::OuterOptimizer(const OuterConfig& c) : cfg_(c) {
  std::string bad = outer_config_error(c);
  if (!bad.empty()) throw std::invalid_argument(bad);
}

void OuterOptimizer::step(double* params, const double* mean_delta, size_t count) {
  const double lr = cfg_.lr;
  const double mu = cfg_.momentum;
  if (mu == 0) {  // plain averaging and SGD without momentum keep no state
    for (size_t i = 0; i < count; ++i) params[i] -= lr * -mean_delta[i];
    steps_++;
    return;
  }
  if (buf_.size() != count) buf_.assign(count, 0.0);
  for (size_t i = 0; i < count; ++i) {
    const double g = -mean_delta[i];
    const double m = mu * buf_[i] + g;
    buf_[i] = m;
    const double u = cfg_.nesterov ? g + mu * m : m;
    params[i] -= lr * u;
  }
  steps_++;
}

bool outer_dtype_ok(DType dt) {
  return dt == DType::kFloat32 || dt == DType::kFloat64 || dt == DType::kFloat16 ||
         dt == DType::kBFloat16;
}

namespace {
// Element i of a float array of dtype dt, as float64 (memcpy: the bytes come off the wire
// with no alignment promise).
double element(const char* src, DType dt, size_t i) {
  switch (dt) {
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, src + 4 * i, 4);
      return f;
    }
    case DType::kFloat64: {
      double d;
      std::memcpy(&d, src + 8 * i, 8);
      return d;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      return dt == DType::kFloat16 ? half::fp16_to_float(h) : half::bf16_to_float(h);
    }
    default:
      throw std::invalid_argument(std::string("outer optimizer: dtype ") + dtype_name(dt) +
                                  " is not a float type");
  }
}
}  // namespace

void add_as_double(const void* src, DType dt, size_t count, double* acc) {
  const char* s = static_cast<const char*>(src);
  for (size_t i = 0; i < count; ++i) acc[i] += element(s, dt, i);
}

void to_double(const void* src, DType dt, size_t count, double* out) {
  const char* s = static_cast<const char*>(src);
  for (size_t i = 0; i < count; ++i) out[i] = element(s, dt, i);
}

void from_double(const double* src, size_t count, DType dt, void* out) {
  char* o = static_cast<char*>(out);
  for (size_t i = 0; i < count; ++i) {
    switch (dt) {
      case DType::kFloat32: {
        float f = static_cast<float>(src[i]);
        std::memcpy(o + 4 * i, &f, 4);
        break;
      }
      case DType::kFloat64:
        std::memcpy(o + 8 * i, &src[i], 8);
        break;
      case DType::kFloat16:
      case DType::kBFloat16: {
        // Through float32 (the 16-bit converters take float32); one extra rounding.
        float f = static_cast<float>(src[i]);
        uint16_t h = dt == DType::kFloat16 ? half::float_to_fp16(f) : half::float_to_bf16(f);
        std::memcpy(o + 2 * i, &h, 2);
        break;
      }
      default:
        throw std::invalid_argument(std::string("outer optimizer: dtype ") + dtype_name(dt) +
                                    " is not a float type");
    }
  }
}

}  // namespace fastps
