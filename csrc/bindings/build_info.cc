// fastps._core.build_info(): what this copy of the core was compiled with, for
// `fastpsrun --check-build` (core/launch/check_build.py). Facts fixed at compile time
// are read from the compiler's macros; the SIMD variants this CPU runs are probed.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "compression/compressor.h"
#include "kernels/sum.h"

namespace py = pybind11;

namespace fastps {

namespace {

std::string compiler() {
#if defined(__clang__)
  return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("gcc ") + __VERSION__;
#else
  return "unknown";
#endif
}

std::vector<std::string> sanitizers() {
  std::vector<std::string> out;
#if defined(__SANITIZE_ADDRESS__)
  out.emplace_back("address");
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  out.emplace_back("address");
#endif
#endif
  return out;
}

std::vector<std::string> codecs() {
  std::vector<std::string> out;
  for (int c = 1; c < static_cast<int>(Codec::kCount); ++c)
    out.emplace_back(codec_name(static_cast<Codec>(c)));
  return out;
}

}  // namespace

void bind_build_info(py::module_& m) {
  m.def(
      "build_info",
      [] {
        py::dict d;
        d["compiler"] = compiler();
        d["cxx_standard"] = static_cast<long>(__cplusplus);
#ifdef NDEBUG
        d["build_type"] = "release";
#else
        d["build_type"] = "debug";
#endif
        d["sanitizers"] = sanitizers();
        d["simd_built"] = simd_levels_built();
        d["simd_supported"] = simd_levels_supported();
        d["simd_active"] = std::string(simd_level());
#if defined(__linux__)
        d["shared_memory"] = true;  // POSIX shm between the processes of one host
#else
        d["shared_memory"] = false;
#endif
        d["codecs"] = codecs();
        d["timeline"] = true;  // the event recorder (common/trace.h) is always compiled in
        return d;
      },
      "What this core was compiled with: compiler, build type, sanitizers, SIMD variants "
      "(built, runnable on this CPU, active), shared memory, compression codecs, timeline.");
}

}  // namespace fastps
