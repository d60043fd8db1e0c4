#include "worker/worker.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "common/logging.h"
#include "kernels/sum.h"
#include "server/engine.h"
#include "transport/handshake.h"
#include "transport/socket.h"

namespace fastps {

namespace {
std::vector<double> weights_or_equal(const WorkerOptions& o) {
  if (!o.server_weights.empty()) {
    if (o.server_weights.size() != o.servers.size())
      throw std::invalid_argument("got " + std::to_string(o.server_weights.size()) +
                                  " server weights for " + std::to_string(o.servers.size()) +
                                  " servers");
    return o.server_weights;
  }
  return std::vector<double>(o.servers.size(), 1.0);
}
}  // namespace

Worker::Worker(WorkerOptions opts)
    : opts_(std::move(opts)), partitioner_(opts_.partition_bytes, weights_or_equal(opts_)) {
  if (opts_.num_workers > 1 && opts_.servers.empty())
    throw std::invalid_argument("a job with more than one worker needs at least one server");
  if (opts_.conns_per_server < 1) opts_.conns_per_server = 1;
}

Worker::~Worker() { shutdown(); }

void Worker::start() {
  loop_ = std::make_unique<EventLoop>("worker-io");
  conns_.resize(opts_.servers.size());
  queues_.resize(opts_.servers.size());
  inflight_.assign(opts_.servers.size(), 0);
  for (size_t s = 0; s < opts_.servers.size(); ++s) {
    for (int k = 0; k < opts_.conns_per_server; ++k) {
      std::string desc = "server " + std::to_string(s) + " at " + opts_.servers[s];
      int fd = tcp_connect(opts_.servers[s], opts_.connect_timeout_s);
      try {
        connect_handshake(fd, opts_.job_id, opts_.token, opts_.rank, static_cast<uint32_t>(k),
                          opts_.connect_timeout_s, desc);
      } catch (...) {
        ::close(fd);
        throw;
      }
      Peer p;
      p.rank = static_cast<uint32_t>(s);
      p.conn_index = static_cast<uint32_t>(k);
      conns_[s].push_back(std::make_shared<Connection>(fd, p, desc, this));
    }
  }
  for (auto& per_server : conns_)
    for (auto& c : per_server) loop_->add(c);
  loop_->start();
  pusher_ = std::thread([this] { push_loop(); });
}

std::vector<std::tuple<size_t, size_t, uint32_t>> Worker::part_layout(const std::string& name,
                                                                       size_t nbytes,
                                                                       size_t elem) const {
  std::vector<std::tuple<size_t, size_t, uint32_t>> out;
  for (auto& p : partitioner_.split(tensor_id_of(name), nbytes, elem))
    out.emplace_back(p.offset, p.len, p.server);
  return out;
}

int64_t Worker::push_pull(const void* in, void* out, size_t nbytes, DType dt,
                          const std::string& name, int priority, double scale) {
  {
    std::lock_guard<std::mutex> lock(err_mu_);
    if (!error_.empty()) throw std::runtime_error(error_);
  }
  size_t elem = dtype_size(dt);
  if (nbytes % elem != 0)
    throw std::invalid_argument("tensor '" + name + "': " + std::to_string(nbytes) +
                                " bytes is not a whole number of " + dtype_name(dt) +
                                " elements");
  auto h = std::make_shared<Handle>();
  h->tensor = registry_.begin(name);
  h->in = static_cast<const char*>(in);
  h->out = static_cast<char*>(out);
  h->nbytes = nbytes;
  h->dtype = dt;
  h->scale = scale;
  h->priority = priority;
  {
    std::lock_guard<std::mutex> lock(handles_mu_);
    h->id = next_handle_++;
    handles_[h->id] = h;
  }
  if (opts_.servers.empty()) {
    // Single worker, no servers: the sum is the input itself.
    if (out != in && nbytes) std::memmove(out, in, nbytes);
    if (scale != 1.0) fastps::scale(out, nbytes / elem, dt, scale);
    registry_.finish(h->tensor, true);
    h->finish("");
    return h->id;
  }
  h->parts = partitioner_.split(h->tensor->id, nbytes, elem);
  h->remaining = static_cast<uint32_t>(h->parts.size());
  if (h->parts.empty()) {
    registry_.finish(h->tensor, true);
    h->finish("");
    return h->id;
  }
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    auto failed = failed_tensors_.find(h->tensor->id);
    if (failed != failed_tensors_.end()) {
      registry_.finish(h->tensor, false);
      h->finish(failed->second);
      return h->id;
    }
    for (auto& p : h->parts) pending_[part_key(h->tensor->id, p.index)] = PartTask{h, p, 0};
  }
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    for (auto& p : h->parts) queues_[p.server].push(PartTask{h, p, seq_++});
  }
  q_cv_.notify_one();
  return h->id;
}

void Worker::push_loop() {
  std::vector<PartTask> batch;
  std::unique_lock<std::mutex> lock(q_mu_);
  while (true) {
    batch.clear();
    q_cv_.wait(lock, [&] {
      if (stop_) return true;
      for (size_t s = 0; s < queues_.size(); ++s)
        if (!queues_[s].empty() &&
            (inflight_[s] == 0 || inflight_[s] + queues_[s].top().span.len <= opts_.credit_bytes))
          return true;
      return false;
    });
    if (stop_) return;
    for (size_t s = 0; s < queues_.size(); ++s) {
      auto& q = queues_[s];
      while (!q.empty() &&
             (inflight_[s] == 0 || inflight_[s] + q.top().span.len <= opts_.credit_bytes)) {
        inflight_[s] += q.top().span.len;
        batch.push_back(q.top());
        q.pop();
      }
    }
    lock.unlock();
    for (auto& t : batch) send_part(t);
    lock.lock();
  }
}

void Worker::send_part(const PartTask& t) {
  const Handle& h = *t.handle;
  auto& per_server = conns_[t.span.server];
  auto& conn = per_server[(t.span.index + (h.tensor->id >> 3)) % per_server.size()];
  FrameHeader hdr{};
  hdr.magic = kFrameMagic;
  hdr.type = static_cast<uint8_t>(MsgType::kPush);
  hdr.dtype = static_cast<uint8_t>(h.dtype);
  hdr.sender = opts_.rank;
  hdr.part = t.span.index;
  hdr.tensor = h.tensor->id;
  hdr.len = t.span.len;
  hdr.tensor_bytes = h.nbytes;
  hdr.round = h.tensor->rounds;
  uint32_t server = t.span.server;
  size_t len = t.span.len;
  bool ok = conn->send(hdr, h.in + t.span.offset, len, [this, server, len] {
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      inflight_[server] -= len;
    }
    q_cv_.notify_one();
  });
  if (!ok) abort("lost connection to " + conn->desc());
}

void* Worker::on_header(Connection* c, const FrameHeader& h, std::string* why) {
  auto type = static_cast<MsgType>(h.type);
  if (type == MsgType::kError || type == MsgType::kFatal) {
    auto text = std::make_shared<std::string>(h.len, '\0');
    void* dst = text->data();
    c->rx_hold = std::move(text);
    return dst;
  }
  if (type != MsgType::kResult) {
    *why = "unexpected frame type " + std::to_string(h.type) + " from " + c->desc();
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(pending_mu_);
  auto it = pending_.find(part_key(h.tensor, h.part));
  if (it == pending_.end() || it->second.span.len != h.len) {
    *why = "result for a part this worker is not waiting for, from " + c->desc();
    return nullptr;
  }
  return it->second.handle->out + it->second.span.offset;
}

void Worker::on_frame(Connection* c, const FrameHeader& h, void* payload) {
  auto type = static_cast<MsgType>(h.type);
  if (type == MsgType::kFatal) {
    auto text = std::static_pointer_cast<std::string>(std::move(c->rx_hold));
    abort(*text);
    return;
  }
  if (type == MsgType::kError) {
    auto text = std::static_pointer_cast<std::string>(std::move(c->rx_hold));
    std::string msg = "tensor '" + registry_.name_of(h.tensor) + "': " + *text;
    std::vector<std::shared_ptr<Handle>> hit;
    {
      std::lock_guard<std::mutex> lock(pending_mu_);
      failed_tensors_[h.tensor] = msg;
      for (auto it = pending_.begin(); it != pending_.end();) {
        if (it->second.handle->tensor->id == h.tensor) {
          hit.push_back(it->second.handle);
          it = pending_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& hd : hit) fail_handle(hd, msg);
    return;
  }
  std::shared_ptr<Handle> handle;
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    auto it = pending_.find(part_key(h.tensor, h.part));
    if (it == pending_.end()) return;
    handle = it->second.handle;
    pending_.erase(it);
  }
  if (handle->scale != 1.0)
    scale(payload, h.len / dtype_size(handle->dtype), handle->dtype, handle->scale);
  part_done(handle);
}

void Worker::part_done(const std::shared_ptr<Handle>& h) {
  if (h->remaining.fetch_sub(1) == 1) {
    registry_.finish(h->tensor, true);
    h->finish("");
  }
}

void Worker::fail_handle(const std::shared_ptr<Handle>& h, const std::string& msg) {
  bool was_running;
  {
    std::lock_guard<std::mutex> lock(h->mu);
    was_running = !h->done;
  }
  if (was_running && h->finish(msg)) registry_.finish(h->tensor, false);
}

void Worker::on_close(Connection* c, bool clean, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(err_mu_);
    if (shutting_down_) return;
  }
  abort("lost connection to " + c->desc() + ": " + reason);
}

void Worker::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(err_mu_);
    if (!error_.empty()) return;
    error_ = reason;
  }
  LOG_WARN("worker " << opts_.rank << " aborting: " << reason);
  std::vector<std::shared_ptr<Handle>> all;
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    for (auto& kv : pending_) all.push_back(kv.second.handle);
    pending_.clear();
  }
  {
    std::lock_guard<std::mutex> lock(handles_mu_);
    for (auto& kv : handles_) all.push_back(kv.second);
  }
  for (auto& h : all) fail_handle(h, reason);
}

std::string Worker::error() const {
  std::lock_guard<std::mutex> lock(err_mu_);
  return error_;
}

std::shared_ptr<Handle> Worker::get(int64_t id) const {
  std::lock_guard<std::mutex> lock(handles_mu_);
  auto it = handles_.find(id);
  if (it == handles_.end())
    throw std::invalid_argument("unknown or already synchronized handle " + std::to_string(id));
  return it->second;
}

bool Worker::poll(int64_t id) {
  auto h = get(id);
  std::lock_guard<std::mutex> lock(h->mu);
  return h->done;
}

void Worker::wait(int64_t id, double timeout_s) {
  auto h = get(id);
  std::unique_lock<std::mutex> lock(h->mu);
  bool ok = h->cv.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return h->done; });
  if (!ok) {
    lock.unlock();
    std::ostringstream os;
    os << "push_pull of tensor '" << h->tensor->name << "' on worker " << opts_.rank
       << " did not complete within " << timeout_s << " s (" << h->remaining.load() << " of "
       << h->parts.size()
       << " parts outstanding); another worker may not have submitted this tensor";
    abort(os.str());
    release(id);
    throw std::runtime_error(os.str());
  }
  std::string err = h->error;
  lock.unlock();
  release(id);
  if (!err.empty()) throw std::runtime_error(err);
}

void Worker::release(int64_t id) {
  std::lock_guard<std::mutex> lock(handles_mu_);
  handles_.erase(id);
}

void Worker::shutdown() {
  {
    std::lock_guard<std::mutex> lock(err_mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
  }
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    stop_ = true;
  }
  q_cv_.notify_all();
  if (pusher_.joinable()) pusher_.join();
  FrameHeader bye{};
  bye.magic = kFrameMagic;
  bye.type = static_cast<uint8_t>(MsgType::kBye);
  bye.sender = opts_.rank;
  for (auto& per_server : conns_)
    for (auto& c : per_server) c->send(bye, nullptr, 0);
  // Give the byes a moment to leave before the sockets close.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (auto& per_server : conns_)
    for (auto& c : per_server)
      while (!c->closed() && std::chrono::steady_clock::now() < deadline && !c->idle())
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (loop_) loop_->stop();
  {
    std::lock_guard<std::mutex> lock(err_mu_);
    if (error_.empty()) error_ = "fastps was shut down";
  }
  std::vector<std::shared_ptr<Handle>> all;
  {
    std::lock_guard<std::mutex> lock(handles_mu_);
    for (auto& kv : handles_) all.push_back(kv.second);
  }
  for (auto& h : all) fail_handle(h, "fastps was shut down while this push_pull was running");
  conns_.clear();
}

}  // namespace fastps
