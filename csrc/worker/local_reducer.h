// The worker's local stage: one thread that copies parts into and out of
// shared memory and sums them, in priority order. It exists whenever the
// worker uses shared memory (a colocated server, or local peers). Parts of at
// most 256 KiB skip it: the thread that has them does that work at once.
//
// With local peers it runs the local reduce (BytePS §4.2): every part has one
// local owner (LocalGroup::owner), so all local workers agree without talking.
// The others copy their part into their own segment and tell the owner where
// it is; the owner sums the contributions (in place, in one of them), pushes
// that single local sum to the part's server through the push scheduler, and,
// once the global sum is back in the same slot, tells the others where to copy
// it from. Each part leaves the host once. When every worker is on this host
// the local sum is the total and goes to no server.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/buffer_pool.h"
#include "transport/connection.h"
#include "worker/failure_fanout.h"
#include "worker/handle_table.h"
#include "worker/local_group.h"
#include "worker/part_table.h"
#include "worker/push_scheduler.h"
#include "worker/worker_stats.h"

namespace fastps {

class LocalReducer {
 public:
  struct Context {
    uint32_t rank = 0;
    uint32_t num_hosts = 0;  // hosts with workers; 1: the local sum is the total
    bool reduce = false;     // local peers exist: parts are reduced here first
    LocalGroup* group = nullptr;
    BufferPool* pool = nullptr;
    PartTable* parts = nullptr;
    // Queues a locally summed part for its server (Worker::enqueue_parts).
    std::function<void(const std::vector<PushTicket>&)> push;
    HandleTable* handles = nullptr;
    FailureFanout* failures = nullptr;
    WorkerStats* stats = nullptr;
  };
  explicit LocalReducer(Context ctx);
  ~LocalReducer();
  void start();
  // Stops the thread; jobs still queued are dropped (their handles fail elsewhere).
  void stop();

  // Local reduce: hands the parts of h this worker does not own to their local
  // owners and registers as the owner of the rest (contributions may be waiting).
  void start_parts(const std::shared_ptr<Handle>& h);
  // A server answered part t (taken out of the part table). Its sum lies in
  // t.stage: hand it to the local peers (owner) and copy it into the output (a part of
  // at most 256 KiB on the caller's thread).
  void on_server_result(const PartTask& t);
  // Frames from local peers (called on the event loop thread).
  void* on_peer_header(Connection* c, const FrameHeader& h, std::string* why);
  void on_peer_frame(Connection* c, const FrameHeader& h, void* payload);
  // Forgets the tensor's parts waiting for contributions; tell_peers: sends
  // them the failure (kLocalError) so they fail the tensor too.
  void drop_tensor(uint64_t tensor, const std::string& msg, bool tell_peers);
  // Whether this worker still needs something from local peer `peer`.
  bool waits_on_peer(uint32_t peer) const;

 private:
  // A local peer's contribution to a part this worker owns.
  struct Contribution {
    FrameHeader hdr;
    Payload data;
  };
  struct OwnerState {
    bool have_task = false;
    PartTask task;
    std::vector<Contribution> got;
  };
  struct Job {
    int priority;
    uint64_t seq;
    std::function<void()> fn;
  };
  struct JobOrder {
    bool operator()(const Job& a, const Job& b) const {
      if (a.priority != b.priority) return a.priority < b.priority;
      return a.seq > b.seq;
    }
  };
  void run();
  void post(int priority, std::function<void()> fn);
  // Runs fn on this thread when it moves at most kInlineBytes (local_reducer.cc), else
  // posts it to the stage.
  void here_or_post(size_t bytes, int priority, std::function<void()> fn);
  void contribute(const PartTask& t);
  void offer(Contribution c);
  std::string check_contribution(const PartTask& t, const FrameHeader& h) const;
  void reduce_owned(OwnerState st);
  void broadcast_result(const PartTask& t);
  void finish_from(const PartTask& t, const char* src);

  Context ctx_;

  // Lock order: own_mu_ and jobs_mu_ are leaves, never held together nor
  // while calling into the part table, the scheduler or a connection.
  mutable std::mutex own_mu_;
  std::unordered_map<uint64_t, OwnerState> owned_;  // parts owned here, by part key

  std::mutex jobs_mu_;
  std::condition_variable jobs_cv_;
  std::priority_queue<Job, std::vector<Job>, JobOrder> jobs_;
  uint64_t job_seq_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace fastps
