// The summation server process's core: accepts authenticated worker
// connections, receives pushes into pooled page-aligned buffers and routes
// each part to the engine thread that owns it.
#pragma once
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/buffer_pool.h"
#include "server/engine.h"
#include "server/options.h"
#include "server/rack_relay.h"
#include "transport/payload.h"
#include "transport/tcp.h"

namespace fastps {

class Server : public FrameHandler, public SlotSpace {
 public:
  explicit Server(ServerOptions opts);
  ~Server() override;
  // Binds and starts serving; returns the bound port.
  int start();
  void stop();
  // "" while healthy; otherwise why the job cannot go on (a worker vanished).
  std::string error() const;
  uint64_t parts_summed() const;
  // Quorum rounds: pushes answered after their round closed without them (docs/guide/async.md).
  uint64_t late_pushes() const;
  // ... and catch-up fetches of closed rounds, answered from the history.
  uint64_t fetched_rounds() const;
  // Nudges sent to a part's last pusher (engine.h).
  uint64_t nudges() const;
  int refused_connections() const { return refused_.load(); }
  // Rack-level hierarchy: rack sums held back now until set_rack_route arrives.
  uint64_t rack_sums_awaiting_route() const { return relay_ ? relay_->awaiting_route() : 0; }
  // Caps the rate of the answers to each worker rank, bytes/s per rank (0:
  // unpaced); applies to open connections and to those accepted later.
  void set_pacing(std::vector<double> per_rank);
  // While fewer than `bytes` of answers wait to be written over all connections, the paced
  // answers to workers go at `bytes_per_s` (this host's link rate) instead of their caps: a
  // short burst of answers does not overlap the workers' pushes that the caps make room
  // for. Until the first such backlog they are not paced at all. 0 (either): always the
  // caps. Not for a rack's relays. Call it before set_pacing.
  void set_pacing_burst(size_t bytes, double bytes_per_s);
  // Times the answers' pacing switched between the caps and the burst rate.
  uint64_t pacing_switches() const { return pacing_switches_.load(); }
  // Rack-level hierarchy: caps the answers to other racks' relays (bytes/s by the relaying
  // server's id) and this server's rack sums up to each owner (by owner position).
  void set_rack_pacing(std::vector<double> answers_by_relay_id, std::vector<double> up_by_owner);
  // Rack-level hierarchy (server/rack_relay.h): every server's address and id, and the
  // worker rank this server's rack sums are pushed as. Set once, after start().
  void set_rack_route(std::vector<std::string> owners, std::vector<uint32_t> owner_ids,
                      uint32_t rank, std::string rack);

  void* on_header(Connection* c, const FrameHeader& h, std::string* why) override;
  void on_frame(Connection* c, const FrameHeader& h, void* payload) override;
  void on_close(Connection* c, bool clean, const std::string& reason) override;
  // A slot in any colocated worker's segment that this server mapped.
  Payload resolve(uint32_t segment, uint64_t offset, uint64_t len) const override;

 private:
  void accept_loop();
  // Hands an authenticated socket to an I/O loop.
  void admit(int fd, const Peer& peer);
  void attach_shm(Connection* c, const FrameHeader& h);
  void broadcast(MsgType type, const FrameHeader& about, const std::string& msg);
  // The job cannot go on: remember why and tell every connected worker.
  void fatal(const std::string& msg);
  std::shared_ptr<Connection> find(Connection* c);

  ServerOptions opts_;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<int> refused_{0};
  std::thread acceptor_;
  std::shared_ptr<BufferPool> pool_;
  std::vector<std::unique_ptr<EventLoop>> loops_;
  std::vector<std::unique_ptr<SumEngine>> engines_;
  std::unique_ptr<RackRelay> relay_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Connection>> conns_;
  // Segments of colocated workers that asked for the shared-memory path, by rank.
  std::unordered_map<uint32_t, std::shared_ptr<ShmSegment>> shm_;
  std::string error_;
  int next_loop_ = 0;
  std::vector<double> pacing_;        // bytes/s per worker rank, guarded by mu_
  std::vector<double> relay_pacing_;  // bytes/s per relaying server id, guarded by mu_
  // The pacing of a connection from its peer (mu_ held).
  double pacing_of(const Peer& peer) const;
  // Switches the workers' connections between their caps and the burst rate when the
  // answers' backlog crossed burst_bytes_ (I/O threads, on each push received).
  void pace_for_backlog();
  // The rate to give a worker's connection now (mu_ held): its cap, the burst rate, or -1
  // for none (a burst before any large backlog: the socket stays unpaced).
  double worker_rate_locked(const Peer& peer);
  bool paced_ = false;  // the caps were set on the workers' connections once (mu_)
  // Bytes of answers (every frame to a worker) queued and not yet written.
  std::atomic<int64_t> answers_unsent_{0};
  std::atomic<size_t> burst_bytes_{0};
  double burst_rate_ = 0;           // guarded by mu_
  std::atomic<bool> burst_{false};  // the workers' connections run at burst_rate_
  std::atomic<uint64_t> pacing_switches_{0};
};

}  // namespace fastps
