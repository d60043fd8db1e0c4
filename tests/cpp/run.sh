#!/usr/bin/env bash
# Builds and runs the C++ unit tests (GoogleTest through ctest) in a build
# directory outside the source tree, one per checkout. Installs GoogleTest from
# Debian if it is missing. Extra arguments go to ctest (e.g. -R PushScheduler).
# FASTPS_SANITIZE=1: build and run under AddressSanitizer and UBSan instead.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-python3}"

if [ ! -f /usr/lib/x86_64-linux-gnu/cmake/GTest/GTestConfig.cmake ] &&
   [ ! -f /usr/lib/cmake/GTest/GTestConfig.cmake ] &&
   ! ls /usr/lib/*/cmake/GTest/GTestConfig.cmake >/dev/null 2>&1; then
  echo "tests/cpp: installing GoogleTest (libgtest-dev)"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get install -y --no-install-recommends libgtest-dev >/dev/null ||
    { $SUDO apt-get update >/dev/null && $SUDO apt-get install -y --no-install-recommends libgtest-dev >/dev/null; }
fi

HASH="$(printf '%s' "$ROOT" | sha1sum | cut -c1-12)"
SAN="${FASTPS_SANITIZE:-0}"
SUFFIX=""
[ "$SAN" = "1" ] && SUFFIX="-asan"
BUILD="${FASTPS_CPP_BUILD_DIR:-${TMPDIR:-/tmp}/fastps-cpp-tests-$HASH$SUFFIX}"
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
# A cache whose build tool is gone (say, a ninja from a deleted virtual
# environment) cannot be reused: start that build directory afresh.
if [ -f "$BUILD/CMakeCache.txt" ]; then
  MAKE_PROGRAM="$(sed -n 's/^CMAKE_MAKE_PROGRAM:[A-Z]*=//p' "$BUILD/CMakeCache.txt")"
  if [ -n "$MAKE_PROGRAM" ] && [ ! -x "$MAKE_PROGRAM" ]; then rm -rf "$BUILD"; fi
fi
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  SANFLAG=OFF
  [ "$SAN" = "1" ] && SANFLAG=ON
  cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DFASTPS_BUILD_TESTS=ON -DFASTPS_SANITIZE="$SANFLAG" \
    -DPython_EXECUTABLE="$(command -v "$PY")" >/dev/null
fi
TARGETS=(test_push_scheduler test_partitioner test_fusion test_kernels test_wire test_link test_loopback test_trace test_compression test_outer_optimizer test_part_path test_engine_nudges)
JOBS="$(nproc 2>/dev/null || echo 2)"
cmake --build "$BUILD" --parallel "$JOBS" --target "${TARGETS[@]}"
cd "$BUILD"
ctest --output-on-failure --timeout 180 "$@"
