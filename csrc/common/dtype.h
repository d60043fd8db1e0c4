// Element types the core can move and sum. The numeric values travel on the
// wire, so they are fixed; add new types only at the end.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace fastps {

enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kUInt8 = 6,
  kInt8 = 7,
  kInt16 = 8,
  kBool = 9,  // summed as logical OR
  kCount = 10,
};

size_t dtype_size(DType dt);
const char* dtype_name(DType dt);
// Parses the names dtype_name returns (numpy spellings: "float32", "bfloat16", ...).
// Throws std::invalid_argument naming the bad string.
DType dtype_from_name(const std::string& name);
bool dtype_is_float(DType dt);

}  // namespace fastps
