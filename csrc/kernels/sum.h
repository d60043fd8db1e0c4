// Reduction kernels used by the summation server and the worker. One portable
// build: the SIMD variant (AVX-512, AVX2, scalar) is chosen once at run time.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace fastps {

// dst[i] += src[i] for i < count. dst and src must not overlap partially.
void sum_into(void* dst, const void* src, size_t count, DType dt);

// dst[i] = a[i] + b[i]. dst may equal a or b.
void sum_to(void* dst, const void* a, const void* b, size_t count, DType dt);

// dst[i] *= factor. Float types compute in float32/float64 and round back;
// integer types compute trunc(dst[i] * factor) in double; bool is unchanged.
void scale(void* dst, size_t count, DType dt, double factor);

// "avx512", "avx2" or "scalar": the variant in use.
const char* simd_level();

// The variants this build holds, and those of them this CPU can run, best last.
std::vector<std::string> simd_levels_built();
std::vector<std::string> simd_levels_supported();

// Forces a variant for tests and benchmarks ("avx512", "avx2", "scalar").
// Returns false (and changes nothing) if the CPU lacks it.
bool set_simd_level(const char* level);

}  // namespace fastps
