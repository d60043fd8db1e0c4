// The one place where a failure becomes failed push_pulls. Two kinds:
// - abort: the job cannot go on (a connection died, a wait timed out, the
//   scheduler said so). The first reason sticks; every running and future
//   push_pull fails with it.
// - fail_tensor: one tensor cannot be summed (a server or the local owner saw
//   workers disagree). Its parts leave the part table, give back their window
//   at the scheduler and, if asked, the local peers are told; later push_pulls
//   of that tensor fail with the same reason.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>

#include "common/errors.h"
#include "worker/handle_table.h"
#include "worker/part_table.h"
#include "worker/push_scheduler.h"

namespace fastps {

class LocalReducer;

class FailureFanout {
 public:
  FailureFanout(uint32_t rank, PartTable* parts, HandleTable* handles, PushScheduler* scheduler)
      : rank_(rank), parts_(parts), handles_(handles), scheduler_(scheduler) {}
  // The local stage, when there is one: it forgets the tensor's half-reduced parts.
  void set_reducer(LocalReducer* r) { reducer_ = r; }

  // kind: how the failed push_pulls report it (common/errors.h).
  // quiet: the reason was reported elsewhere already (the scheduler's abort): log it
  // at info level only, so the root cause is not repeated by every worker.
  void abort(const std::string& reason, ErrorKind kind = ErrorKind::kAbort, bool quiet = false);
  // tell_peers: this worker found the failure, so the local peers must hear of it.
  void fail_tensor(uint64_t tensor, const std::string& msg, bool tell_peers);
  // "" while healthy; else the abort reason.
  std::string error() const;
  // Throws the abort reason, typed by its kind, if the worker aborted.
  void throw_if_failed() const;
  // Marks the worker as shutting down; false if it already was.
  bool begin_shutdown();
  bool shutting_down() const;
  // Shutdown's end: later push_pulls fail, and the running ones with `running_msg`.
  void fail_for_shutdown(const std::string& running_msg);

 private:
  uint32_t rank_;
  PartTable* parts_;
  HandleTable* handles_;
  PushScheduler* scheduler_;
  LocalReducer* reducer_ = nullptr;
  // A leaf lock, held only to read or set the two fields below.
  mutable std::mutex mu_;
  std::string error_;
  ErrorKind error_kind_ = ErrorKind::kError;
  bool shutting_down_ = false;
};

}  // namespace fastps
