#include "worker/failure_fanout.h"

#include "common/logging.h"
#include "worker/local_reducer.h"

namespace fastps {

void FailureFanout::abort(const std::string& reason, ErrorKind kind, bool quiet) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty()) return;
    error_ = reason;
    error_kind_ = kind;
  }
  if (quiet)
    LOG_INFO("worker " << rank_ << " aborting: " << reason);
  else
    LOG_WARN("worker " << rank_ << " aborting: " << reason);
  for (auto& t : parts_->take_all()) handles_->fail(t.handle, reason, kind);
  for (auto& h : handles_->all()) handles_->fail(h, reason, kind);
}

void FailureFanout::fail_tensor(uint64_t tensor, const std::string& msg, bool tell_peers) {
  if (reducer_) reducer_->drop_tensor(tensor, msg, tell_peers);
  std::vector<PartTask> hit = parts_->fail_tensor(tensor, msg);
  for (auto& t : hit)
    if (t.in_flight) scheduler_->answered(t.ticket());
  // Workers disagreed about the tensor: the job cannot trust it any more.
  for (auto& t : hit) handles_->fail(t.handle, msg, ErrorKind::kAbort);
}

std::string FailureFanout::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void FailureFanout::throw_if_failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_.empty()) throw_error(error_kind_, error_);
}

bool FailureFanout::begin_shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return false;
  shutting_down_ = true;
  return true;
}

bool FailureFanout::shutting_down() const {
  std::lock_guard<std::mutex> lock(mu_);
  return shutting_down_;
}

void FailureFanout::fail_for_shutdown(const std::string& running_msg) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) error_ = "fastps was shut down";
  }
  for (auto& h : handles_->all()) handles_->fail(h, running_msg, ErrorKind::kError);
}

}  // namespace fastps
