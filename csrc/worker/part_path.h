// How the parts of one push_pull travel, chosen once when its handle is created: a
// plain sum (staged in shared memory where a colocated server maps it, or sent to this
// rack's relay under the rack hierarchy), a routed or async push (send / receive off,
// pushers named, parameters kept on the servers), a catch-up fetch of a closed quorum
// round, or a compressed part. Each kind is one PartPath (worker/paths/): it refuses the
// requests it cannot carry in this job, pushes a part, and takes the part's answer. The
// Worker keeps one of each (PartPaths) and every handle points at its own, so the push
// thread and the network thread make one virtual call per part instead of branching
// over the modes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "compression/error_feedback.h"
#include "transport/connection.h"
#include "transport/link.h"
#include "worker/handle.h"
#include "worker/handle_table.h"
#include "worker/options.h"
#include "worker/part_table.h"
#include "worker/push_scheduler.h"
#include "worker/registry.h"
#include "worker/request.h"
#include "worker/worker_stats.h"

namespace fastps {

class LocalGroup;
class LocalReducer;

// The worker's parts a path works with; they outlive every path.
struct PathContext {
  const WorkerOptions* opts = nullptr;
  uint32_t pushers = 0;       // pushes per plain part each server waits for (hosts or workers)
  bool local_reduce = false;  // local peers: plain parts are reduced on this host first
  // [server][k], filled by Worker::start before the first part is pushed.
  const std::vector<std::vector<Link>>* links = nullptr;
  PushScheduler* scheduler = nullptr;
  PartTable* parts = nullptr;
  HandleTable* handles = nullptr;
  const TensorRegistry* registry = nullptr;
  LocalGroup* local = nullptr;      // null: no shared memory in use
  LocalReducer* reducer = nullptr;  // the local stage; null without local
  ErrorFeedback* error_feedback = nullptr;
  WorkerStats* stats = nullptr;
  // Ends the job with this reason (Worker::abort).
  std::function<void(const std::string&)> abort;
  // A part's bytes left for server `server` (its credit returns): Worker::on_written.
  std::function<void(uint32_t server, size_t len)> written;
};

enum class PathKind : uint8_t { kPlain = 0, kRouted = 1, kFetch = 2, kCompressed = 3 };
constexpr int kPathKinds = 4;

// The kind of path a push_pull with these settings takes. Which requests a path accepts
// is its check(); this only picks the one whose refusals apply.
PathKind path_kind(PushMode mode, bool send, bool receive, uint32_t pushers, bool compressed);
inline PathKind path_kind(const PushPullRequest& r) {
  return path_kind(r.mode, r.send, r.receive, r.pushers, r.compression.enabled());
}
inline PathKind path_kind(const Handle& h) {
  return path_kind(h.mode, h.send, h.receive, h.pushers, h.compression.enabled());
}

class PartPath {
 public:
  explicit PartPath(PathContext ctx) : ctx_(std::move(ctx)) {}
  virtual ~PartPath() = default;
  PartPath(const PartPath&) = delete;
  PartPath& operator=(const PartPath&) = delete;

  // "plain", "relayed", "routed", "fetch" or "compressed".
  virtual const char* name() const = 0;
  // Parts go straight to the servers: no fusion, no local reduce, no staging slot.
  virtual bool direct() const = 0;
  // Throws std::invalid_argument naming the tensor if this job cannot carry r this way.
  virtual void check(const PushPullRequest& r) const = 0;
  // Pushes part t, taken off the push queue, to its server (on the push thread). Its
  // credit returns to the scheduler once written; a closed connection aborts the job.
  virtual void send(PartTask& t) const = 0;
  // An answer's header for a part of this path that this worker pushed: where its
  // payload goes (nullptr: nothing follows, or with *why set: refused, which closes c).
  virtual void* receive(Connection* c, const FrameHeader& h, std::string* why) const;
  // The answer to part t is in (t is out of the part table, its slot checked): the sum goes
  // to the output and the part ends. On the network thread.
  virtual void take_result(Connection* c, const FrameHeader& h, const PartTask& t,
                           void* payload) const = 0;

 protected:
  // The link part t goes out on among those to `server`.
  const Link& link_to(uint32_t server, const PartTask& t) const {
    const auto& per_server = (*ctx_.links)[server];
    return per_server[(t.span.index + (t.handle->tensor->id >> 3)) % per_server.size()];
  }
  // Sends hdr with payload p on link; once written, credit_len bytes of credit go back to
  // the scheduler's server credit_to (the timeline names `to`, where the bytes went).
  // False if the connection is closed.
  bool write_part(const Link& link, const FrameHeader& hdr, const Payload& p, uint32_t to,
                  uint32_t credit_to, size_t credit_len) const;
  // Quorum rounds: a plain sum's answer says how many rounds of the tensor closed after it.
  // With a local sum the host pushed, not this worker: its peers never hear it, so nobody
  // acts on it.
  void note_lag(const FrameHeader& h, const PartTask& t) const {
    if (ctx_.opts->quorum && !ctx_.local_reduce) t.handle->note_lag(h.pushers);
  }
  // The sum lies where it belongs (the output): scales it and ends the part.
  void finish_in_place(const FrameHeader& h, const PartTask& t, void* payload) const;
  // Refuses r unless its dtype can be compressed; then, if this path cannot carry a
  // compressed push_pull at all, refuses that.
  static void check_compression(const PushPullRequest& r, bool allowed_here);

  PathContext ctx_;
};

// Where an uncompressed answer's payload goes: the part's output or staging slot, or
// nowhere for an empty answer to a push that wants no result. nullptr with *why set when
// the worker is not waiting for such an answer.
void* receive_in_place(const PartTable& parts, Connection* c, const FrameHeader& h,
                       std::string* why);

// One path of each kind for a worker, built once; handles point at them.
class PartPaths {
 public:
  // Under the rack hierarchy (opts->relay_via set) the plain sum is the relayed path.
  explicit PartPaths(const PathContext& ctx);
  ~PartPaths();
  const PartPath& get(PathKind k) const { return *paths_[static_cast<int>(k)]; }
  const PartPath& of(const PushPullRequest& r) const { return get(path_kind(r)); }
  const PartPath& of(const Handle& h) const { return get(path_kind(h)); }

 private:
  std::unique_ptr<PartPath> paths_[kPathKinds];
};

}  // namespace fastps
