#include "common/dtype.h"

#include <stdexcept>

namespace fastps {

namespace {

struct DTypeInfo {
  DType dt;
  const char* name;
  size_t size;
  bool is_float;
};

// Indexed by the DType value; the static_asserts below keep the order honest.
constexpr DTypeInfo kInfo[] = {
    {DType::kFloat32, "float32", 4, true}, {DType::kFloat64, "float64", 8, true},
    {DType::kFloat16, "float16", 2, true}, {DType::kBFloat16, "bfloat16", 2, true},
    {DType::kInt32, "int32", 4, false},    {DType::kInt64, "int64", 8, false},
    {DType::kUInt8, "uint8", 1, false},    {DType::kInt8, "int8", 1, false},
    {DType::kInt16, "int16", 2, false},    {DType::kBool, "bool", 1, false},
};

constexpr size_t kNumTypes = static_cast<size_t>(DType::kCount);
static_assert(sizeof(kInfo) / sizeof(kInfo[0]) == kNumTypes, "one entry per DType");

constexpr bool table_in_enum_order() {
  for (size_t i = 0; i < kNumTypes; ++i) {
    if (static_cast<size_t>(kInfo[i].dt) != i) return false;
  }
  return true;
}
static_assert(table_in_enum_order(), "kInfo must follow the DType numbering");

const DTypeInfo& info(DType dt) {
  const size_t i = static_cast<size_t>(dt);
  if (i >= kNumTypes) {
    throw std::invalid_argument("invalid dtype code " + std::to_string(i));
  }
  return kInfo[i];
}

}  // namespace

size_t dtype_size(DType dt) { return info(dt).size; }

const char* dtype_name(DType dt) { return info(dt).name; }

DType dtype_from_name(const std::string& name) {
  for (const DTypeInfo& e : kInfo) {
    if (name == e.name) return e.dt;
  }
  throw std::invalid_argument("unknown dtype '" + name +
                              "' (expected one of float32, float64, float16, bfloat16, "
                              "int32, int64, uint8, int8, int16, bool)");
}

bool dtype_is_float(DType dt) { return info(dt).is_float; }

}  // namespace fastps
