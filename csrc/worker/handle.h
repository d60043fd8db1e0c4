// Completion state of one push_pull: done when every part's sum is back.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/errors.h"
#include "compression/compressor.h"
#include "worker/partitioner.h"
#include "worker/registry.h"

namespace fastps {

class PartPath;

// What a push asks of the server: a plain sum, or (docs/guide/async.md) an update of the
// parameters it keeps, their initial value from rank 0, or a read of them; or, under quorum
// rounds, a catch-up fetch: the sum of the tensor's next round, which closed without this
// worker, from the servers' history (want-only, nothing counted; the round still counts
// as this worker's, so its next push is of the round after). kQuorumSum is the plain sum of a
// gradient: under quorum rounds its round may close with the quorum; every other sum (an
// allreduce of metrics or counts) waits for all and is exact.
enum class PushMode : uint8_t {
  kSum = 0,
  kAsyncUpdate = 1,
  kAsyncInit = 2,
  kAsyncRead = 3,
  kQuorumFetch = 4,
  kQuorumSum = 5,
};
constexpr int kPushModes = 6;

// A plain sum of every worker's push (a gradient's or not).
inline bool plain_sum(PushMode m) { return m == PushMode::kSum || m == PushMode::kQuorumSum; }

// What a push of mode `m` is, for error messages.
inline const char* push_mode_text(PushMode m) {
  switch (m) {
    case PushMode::kSum:
      return "a sum";
    case PushMode::kAsyncUpdate:
      return "an async update";
    case PushMode::kAsyncInit:
      return "an async init";
    case PushMode::kAsyncRead:
      return "an async read";
    case PushMode::kQuorumFetch:
      return "a catch-up fetch";
    case PushMode::kQuorumSum:
      return "a gradient's (quorum) sum";
  }
  return "an unknown push";
}

struct Handle {
  int64_t id = 0;
  TensorEntry* tensor = nullptr;
  const char* in = nullptr;
  char* out = nullptr;
  size_t nbytes = 0;
  DType dtype = DType::kFloat32;
  double scale = 1.0;
  int priority = 0;
  // A routed push_pull (protocol: kFlagNoData / kFlagNoReply): whether this worker's
  // input is part of the sum (send) and whether it wants the result (receive), and how
  // many workers push each part (pushers; 0: every worker, the plain sum).
  bool send = true;
  bool receive = true;
  uint32_t pushers = 0;
  PushMode mode = PushMode::kSum;
  // A catch-up fetch travels as the plain sum it stands for does (fused alike), want-only.
  bool fetch() const { return mode == PushMode::kQuorumFetch; }
  CompressionSpec compression;  // enabled: parts travel compressed, straight to the servers
  // How its parts travel (worker/part_path.h), chosen from the fields above when the
  // handle is created; owned by the worker, which outlives its handles.
  const PartPath* path = nullptr;
  std::vector<PartSpan> parts;
  std::atomic<uint32_t> remaining{0};
  // Quorum rounds: how many of this tensor's rounds closed after the one answered, the
  // least over its parts (the server says it in a late answer's header; 0: none).
  void note_lag(uint64_t rounds) {
    uint64_t cur = lag_.load();
    while (rounds < cur && !lag_.compare_exchange_weak(cur, rounds)) {
    }
  }
  uint64_t rounds_behind() const {
    uint64_t l = lag_.load();
    return l == UINT64_MAX ? 0 : l;
  }

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string error;  // empty on success
  ErrorKind error_kind = ErrorKind::kError;
  // Runs once, after the handle ended (error empty: success), on the thread that ended
  // it, with no lock held: a fusion bucket hands its sum or failure to its members.
  std::function<void(const std::string& error, ErrorKind kind)> on_end;

  // First caller wins; later completions/failures are ignored.
  bool finish(const std::string& err, ErrorKind kind = ErrorKind::kError) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (done) return false;
      done = true;
      error = err;
      error_kind = kind;
    }
    cv.notify_all();
    return true;
  }

 private:
  std::atomic<uint64_t> lag_{UINT64_MAX};  // UINT64_MAX: no part answered yet
};

}  // namespace fastps
