// The error types the core throws to its callers. The bindings map each one to
// an exception class of fastps.errors, so Python code tells a timeout from an
// aborted job by its type, never by the wording of the message.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

namespace fastps {

// Why an operation ended without a result; kept with a failed handle so the
// wait that reports it throws the matching type.
enum class ErrorKind : uint8_t {
  kError,    // anything else: a usage error, the worker was shut down
  kTimeout,  // a bounded wait (connect, attach, push_pull) ran out of time
  kAbort,    // the job cannot go on: a peer died or disagreed, or a node asked to abort
};

// Base of the core's own errors (fastps.errors.FastPSError in Python).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// fastps.errors.FastPSTimeoutError in Python.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// fastps.errors.FastPSAbort in Python.
class AbortError : public Error {
 public:
  using Error::Error;
};

[[noreturn]] inline void throw_error(ErrorKind kind, const std::string& what) {
  switch (kind) {
    case ErrorKind::kTimeout:
      throw TimeoutError(what);
    case ErrorKind::kAbort:
      throw AbortError(what);
    case ErrorKind::kError:
      break;
  }
  throw Error(what);
}

}  // namespace fastps
