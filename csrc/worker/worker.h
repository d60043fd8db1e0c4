// The worker's communication service, a thin front over its parts:
// push_pull cuts a tensor into parts (Partitioner) and registers them
// (PartTable, HandleTable); the PushScheduler decides which part goes next to
// which server; a push thread here hands those to the handle's part path
// (PartPaths: plain, relayed, routed, fetch or compressed, chosen once per
// handle), which pushes them on the connections; each server answers a push
// with the summed part, received straight into the output memory, and the
// path takes it. With shared memory, the LocalReducer (local stage) moves parts
// through the host's segments and sums them among local workers first. Every
// failure goes through FailureFanout.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/buffer_pool.h"
#include "common/dtype.h"
#include "common/errors.h"
#include "compression/compressor.h"
#include "compression/error_feedback.h"
#include "transport/connection.h"
#include "transport/link.h"
#include "transport/tcp.h"
#include "worker/failure_fanout.h"
#include "worker/fusion.h"
#include "worker/handle.h"
#include "worker/handle_table.h"
#include "worker/local_group.h"
#include "worker/local_reducer.h"
#include "worker/options.h"
#include "worker/part_path.h"
#include "worker/part_table.h"
#include "worker/partitioner.h"
#include "worker/push_scheduler.h"
#include "worker/registry.h"
#include "worker/request.h"
#include "worker/worker_stats.h"

namespace fastps {

class Worker : public FrameHandler {
 public:
  explicit Worker(WorkerOptions opts);
  ~Worker() override;
  void start();
  // Starts summing nbytes at `in` across workers into `out` (may equal in),
  // multiplied by scale. Memory must stay valid until the handle completes.
  int64_t push_pull(const void* in, void* out, size_t nbytes, DType dt, const std::string& name,
                    int priority, double scale);
  // Starts several push_pulls at once: all or none start (a bad request starts
  // nothing), and their parts enter the push queues together, so every worker
  // pushes them in one urgency order from the first byte on. Handle ids in order.
  std::vector<int64_t> push_pull_group(const std::vector<PushPullRequest>& reqs);
  // Fuses the small tensors among `members` (worker/fusion.h) from their next push_pull
  // on, replacing plan `plan` (no members: removes it). Buckets the old plan leaves
  // half-filled are pushed now, zeros in place of the missing members: call it at the
  // same point on every worker. A no-op when fusion is off (fusion_threshold 0) or
  // without servers. Returns the number of buckets.
  size_t set_fusion_plan(const std::string& plan, const std::vector<FusionMember>& members);
  bool poll(int64_t handle);
  // Waits, releases the handle; throws TimeoutError when timeout_s passes (which
  // aborts the job), else the error type the handle failed with (common/errors.h).
  // Returns how many rounds of the tensor closed after the one answered (quorum rounds:
  // the rounds to fetch with PushMode::kQuorumFetch before the next push; else 0).
  uint64_t wait(int64_t handle, double timeout_s);
  void release(int64_t handle);
  // Fails every pending and future operation with this reason, as an error of this kind.
  // quiet: the reason was already reported elsewhere (the scheduler's abort); log it
  // at info level only, so the root cause is not repeated by every worker.
  void abort(const std::string& reason, ErrorKind kind = ErrorKind::kAbort, bool quiet = false);
  std::string error() const;
  void shutdown();
  using Stats = WorkerStats;
  const Stats& stats() const { return stats_; }
  bool local_reduce() const { return local_reduce_; }
  // The parts a tensor of this name and size is cut into: (offset, len, server) each.
  std::vector<std::tuple<size_t, size_t, uint32_t>> part_layout(const std::string& name,
                                                                size_t nbytes, size_t elem) const;

  void* on_header(Connection* c, const FrameHeader& h, std::string* why) override;
  void on_frame(Connection* c, const FrameHeader& h, void* payload) override;
  void on_close(Connection* c, bool clean, const std::string& reason) override;

 private:
  void attach_local_servers();
  // The pushes of a push_pull_group after its handles exist: the fused ones wait in
  // their buckets, complete buckets and the rest are cut into parts and queued.
  void start_handles(std::vector<std::shared_ptr<Handle>> hs);
  // A handle of its own for each bucket, ending its members when the sum is back.
  std::vector<std::shared_ptr<Handle>> bucket_handles(
      const std::vector<std::shared_ptr<FusionBucket>>& buckets);
  void push_loop();
  // The scheduler's keep() for a taker (push thread or pump): takes the parts it marks as
  // pushed into *tasks.
  std::function<bool(const PushTicket&)> marker(std::vector<PartTask>* tasks);
  // A part's bytes left for server `server`: returns its credit, and pushes what that
  // admits now, on the network thread itself (opts.push_from_io) or by waking the push
  // thread.
  void on_written(uint32_t server, size_t len);
  // Whether the caller may push the parts it admitted itself: the network thread, with
  // opts.push_from_io.
  bool pushes_here() const;
  // Pushes every admissible light part from the network thread (see options.h
  // push_from_io); the first that is not light wakes the push thread.
  void pump();
  // Takes the admissible light parts (the first that is not light wakes the push thread)
  // and sends them from this thread: the pump's and a small push_pull's caller's one step.
  // Returns whether it sent any.
  bool send_admissible();
  // Queues a push_pull's parts; a small one's (at most kCallerPushBytes, nothing else
  // queued or unwritten) the caller's thread pushes itself when the servers admit them
  // (opts.push_from_io).
  void enqueue_parts(const std::vector<PushTicket>& tickets);
  // Switches the paced connections between their caps and the burst rate (push thread
  // and network thread; pacing_mu_).
  void pace_for_backlog();
  // A server's answer to a part: checked here, taken by the part's path.
  void* on_result_header(Connection* c, const FrameHeader& h, std::string* why);
  void on_result(Connection* c, const FrameHeader& h, void* payload);
  void on_attached(Connection* c, const std::string& why_not);
  // Stops the push thread, the local stage and (with the loop) the network thread; once it
  // returns no stage touches a caller's memory. Idempotent; a second caller waits for the
  // first. Called before a wait reports an abort: the caller frees its tensors at once.
  void stop_stages(bool with_loop);

  WorkerOptions opts_;
  Partitioner partitioner_;
  PushScheduler scheduler_;
  TensorRegistry registry_;
  HandleTable handles_;
  PartTable parts_;
  Fuser fuser_;
  FailureFanout failures_;
  std::shared_ptr<BufferPool> pool_;
  std::unique_ptr<LocalGroup> local_;      // null: no shared memory in use
  std::unique_ptr<LocalReducer> reducer_;  // the local stage; null without local_
  bool local_reduce_ = false;              // several workers here: parts reduced locally first
  uint32_t pushers_ = 0;                   // pushes per part each server waits for
  ErrorFeedback error_feedback_;           // compressed parts' residuals, by part key
  Stats stats_;
  std::unique_ptr<PartPaths> paths_;  // one per kind; built last, over the parts above

  // Lock order of the worker and its parts (a lock may be taken while holding
  // one to its left, never the other way):
  //   PushScheduler::mu_ -> PartTable::mu_
  // Every other lock is a leaf, held only for its own fields and never while
  // calling another component or sending on a connection: attach_mu_ here,
  // HandleTable::mu_, Handle::mu, TensorRegistry::mu_, FailureFanout::mu_,
  // LocalReducer::own_mu_ and ::jobs_mu_, Connection::send_mu_. stages_mu_ is taken
  // first of all (stop_stages joins the stage threads while holding it).
  std::mutex stages_mu_;
  bool stages_stopped_ = false;
  bool loop_stopped_ = false;
  std::mutex attach_mu_;
  std::condition_variable attach_cv_;
  size_t attach_replies_ = 0;

  std::unique_ptr<EventLoop> loop_;
  // [server][k]. Whether a server mapped this host's segments is set on its
  // links by the loop thread before start() returns (attach_mu_ orders it).
  std::vector<std::vector<Link>> links_;
  std::thread pusher_;
  // The paced connections run at the burst rate, or (before the first large backlog) are
  // not paced at all (start, then pace_for_backlog under pacing_mu_).
  std::mutex pacing_mu_;
  bool pacing_burst_ = false;
  // The network thread is in pump(): a send whose bytes left at once calls on_written
  // inline, which then only asks pump() to go round again (network thread only).
  bool pumping_ = false;
  bool pump_again_ = false;
};

}  // namespace fastps
