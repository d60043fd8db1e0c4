// The worker's communication service: push_pull cuts a tensor into parts,
// queues them by priority per server, and a push-stage thread hands them to
// the transport within each server's credit window. Each server answers a
// push with the summed part, received straight into the output memory.
#pragma once
#include <atomic>
#include <map>
#include <condition_variable>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "common/buffer_pool.h"
#include "common/dtype.h"
#include "transport/tcp.h"
#include "worker/handle.h"
#include "worker/local_reduce.h"
#include "worker/partitioner.h"
#include "worker/registry.h"

namespace fastps {

struct WorkerOptions {
  uint32_t rank = 0;
  uint32_t num_workers = 1;
  std::vector<std::string> servers;      // "host:port" per server id
  std::vector<double> server_weights;    // empty: equal
  std::string job_id;
  std::string token;
  size_t partition_bytes = 4u << 20;
  size_t credit_bytes = 4u << 20;
  // Bytes of parts more urgent than the next one that may wait unanswered at a server
  // with an even share of the bytes, scaled by each server's share (see
  // Worker::window_open); 0: no such limit.
  size_t window_bytes = 1u << 20;
  // TCP_NOTSENT_LOWAT on the connections to servers; 0: the kernel's default.
  size_t notsent_lowat = 128u << 10;
  // Rate cap per server, bytes/s, split over that server's connections
  // (core/placement.py pacing_plan); empty or 0: unpaced.
  std::vector<double> pacing_bytes_per_s;
  int conns_per_server = 1;
  double connect_timeout_s = 60.0;
  // Shared memory (BytePS §6.2) and local reduce (§4.2): the workers on this
  // host (this one included; empty: only this one), which servers share this
  // host, and how many hosts have workers (the pushes a server waits for per
  // part once each host pushes its local sum). shm = false: plain TCP only.
  std::vector<uint32_t> local_ranks;
  std::vector<bool> local_servers;
  uint32_t num_hosts = 0;
  bool shm = true;
  size_t shm_bytes = 256u << 20;
};

// One tensor of a push_pull_group.
struct PushPullRequest {
  const void* in = nullptr;
  void* out = nullptr;
  size_t nbytes = 0;
  DType dtype = DType::kFloat32;
  std::string name;
  int priority = 0;
  double scale = 1.0;
};

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
  bool poll(int64_t handle);
  // Waits, releases the handle, throws std::runtime_error on failure/timeout.
  void wait(int64_t handle, double timeout_s);
  void release(int64_t handle);
  // Fails every pending and future operation with this reason.
  void abort(const std::string& reason);
  std::string error() const;
  void shutdown();
  // How parts moved so far: tests check that the shared-memory paths are taken.
  struct Stats {
    std::atomic<uint64_t> pushed_shm{0};         // pushes whose bytes stayed in shared memory
    std::atomic<uint64_t> pushed_socket{0};      // pushes whose bytes went over TCP
    std::atomic<uint64_t> reduced_locally{0};    // parts this worker summed as local owner
    std::atomic<uint64_t> contributed_shm{0};    // parts handed to a local owner in shm
    std::atomic<uint64_t> contributed_socket{0}; // ... over the local socket (no slot free)
  };
  const Stats& stats() const { return stats_; }
  bool local_reduce() const { return local_reduce_; }
  // The parts a tensor of this name and size is cut into: (offset, len, server) each.
  std::vector<std::tuple<size_t, size_t, uint32_t>> part_layout(const std::string& name,
                                                                 size_t nbytes,
                                                                 size_t elem) const;

  void* on_header(Connection* c, const FrameHeader& h, std::string* why) override;
  void on_frame(Connection* c, const FrameHeader& h, void* payload) override;
  void on_close(Connection* c, bool clean, const std::string& reason) override;

 private:
  void start_local_reduce(const std::shared_ptr<Handle>& h);
  struct PartTask {
    std::shared_ptr<Handle> handle;
    PartSpan span;
    uint64_t seq;
    bool owned = true;  // false: a local peer reduces and pushes this part
    Staging stage;      // bytes pushed and where the sum lands; empty: the user's memory
    Staging mine;       // not owned: this worker's contribution, held until the sum is back
    bool in_flight = false;  // pushed: in its server's window until answered or failed
  };
  // A local peer's contribution to a part this worker owns.
  struct Contribution {
    FrameHeader hdr;
    Staging data;
  };
  struct OwnerState {
    bool have_task = false;
    PartTask task;
    std::vector<Contribution> got;
  };
  struct LocalJob {
    int priority;
    uint64_t seq;
    std::function<void()> fn;
  };
  struct LocalJobOrder {
    bool operator()(const LocalJob& a, const LocalJob& b) const {
      if (a.priority != b.priority) return a.priority < b.priority;
      return a.seq > b.seq;
    }
  };
  // Urgency, the same on every worker: priority, then tensor id (a hash of the
  // name), then part index. Only one push_pull per name runs at a time, so this is
  // a strict total order of everything queued, which the window needs (window_open).
  using UrgencyKey = std::tuple<int64_t, uint64_t, uint32_t>;  // smaller: more urgent
  static UrgencyKey urgency(const PartTask& t) {
    return UrgencyKey{-static_cast<int64_t>(t.handle->priority), t.handle->tensor->id,
                      t.span.index};
  }
  struct TaskOrder {
    bool operator()(const PartTask& a, const PartTask& b) const {
      return urgency(a) > urgency(b);
    }
  };
  void push_loop();
  // Whether server s admits its next queued part now (q_mu_ held).
  bool window_open(size_t s) const;
  // Marks a queued part as sent; false if it failed meanwhile (then it is dropped).
  bool take_off_queue(const PartTask& t);
  // Returns a pushed part's bytes to its server's credit once its sum is back or it failed.
  void release_credit(const PartTask& t);
  void send_part(PartTask t);
  void attach_local_servers();
  FrameHeader header_for(MsgType type, const PartTask& t) const;
  // Local stage (one thread): copies into and out of shared memory and sums.
  void local_loop();
  void post_local(int priority, std::function<void()> fn);
  void contribute(const PartTask& t);
  void offer(Contribution c);
  std::string check_contribution(const PartTask& t, const FrameHeader& h) const;
  void reduce_owned(OwnerState st);
  void broadcast_result(const PartTask& t);
  void finish_from(const PartTask& t, const char* src);
  void fail_tensor(uint64_t tensor, const std::string& msg, bool tell_peers);
  void on_local_frame(Connection* c, const FrameHeader& h, void* payload);
  void set_stage(uint64_t key, const Staging& s, bool mine);
  bool waits_on_peer(uint32_t peer);
  void part_done(const std::shared_ptr<Handle>& h);
  void fail_handle(const std::shared_ptr<Handle>& h, const std::string& msg);
  std::shared_ptr<Handle> get(int64_t id) const;

  WorkerOptions opts_;
  Partitioner partitioner_;
  std::shared_ptr<BufferPool> pool_;
  std::unique_ptr<LocalGroup> local_;  // null: no shared memory in use
  bool local_reduce_ = false;          // several workers here: parts reduced locally first
  uint32_t pushers_ = 0;               // pushes per part each server waits for
  std::vector<bool> server_shm_;       // server s mapped this host's segments
  Stats stats_;

  std::mutex attach_mu_;
  std::condition_variable attach_cv_;
  size_t attach_replies_ = 0;

  std::mutex own_mu_;
  std::unordered_map<uint64_t, OwnerState> owned_;

  std::mutex lq_mu_;
  std::condition_variable lq_cv_;
  std::priority_queue<LocalJob, std::vector<LocalJob>, LocalJobOrder> local_jobs_;
  uint64_t local_seq_ = 0;
  bool local_stop_ = false;
  std::thread local_thread_;
  TensorRegistry registry_;
  std::unique_ptr<EventLoop> loop_;
  std::vector<std::vector<std::shared_ptr<Connection>>> conns_;  // [server][k]

  // Push stage.
  std::mutex q_mu_;
  std::condition_variable q_cv_;
  std::vector<std::priority_queue<PartTask, std::vector<PartTask>, TaskOrder>> queues_;
  std::vector<size_t> inflight_;  // bytes handed to the socket, not yet written
  // Parts pushed and not yet answered, per server, by urgency -> bytes.
  std::vector<std::map<UrgencyKey, size_t>> unanswered_;
  std::vector<size_t> window_;  // window_bytes scaled by the server's share of the bytes
  uint64_t seq_ = 0;
  bool stop_ = false;
  std::thread pusher_;

  // Parts waiting for their sum, by part key.
  mutable std::mutex pending_mu_;
  std::unordered_map<uint64_t, PartTask> pending_;
  std::unordered_map<uint64_t, std::string> failed_tensors_;

  mutable std::mutex handles_mu_;
  std::unordered_map<int64_t, std::shared_ptr<Handle>> handles_;
  int64_t next_handle_ = 1;

  mutable std::mutex err_mu_;
  std::string error_;
  bool shutting_down_ = false;
};

}  // namespace fastps
