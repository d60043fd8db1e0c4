#include "server/engine.h"

#include <sstream>

#include "common/dtype.h"
#include "common/logging.h"
#include "kernels/sum.h"

namespace fastps {

SumEngine::SumEngine(int index, uint32_t num_workers, uint32_t server_id)
    : index_(index), num_workers_(num_workers), server_id_(server_id) {}

SumEngine::~SumEngine() { stop(); }

void SumEngine::start() { thread_ = std::thread([this] { run(); }); }

void SumEngine::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  keys_.clear();
}

void SumEngine::post(PushWork&& w) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(w));
  }
  cv_.notify_one();
}

void SumEngine::run() {
  std::deque<PushWork> batch;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      batch.swap(queue_);
    }
    for (auto& w : batch) handle(w);
    batch.clear();
  }
}

static std::string describe(uint8_t dtype, uint64_t len, uint64_t tensor_bytes) {
  std::ostringstream os;
  os << len << " bytes of " << dtype_name(static_cast<DType>(dtype)) << " (whole tensor "
     << tensor_bytes << " bytes)";
  return os.str();
}

void SumEngine::fail(KeyState& st, const FrameHeader& h, const std::string& msg) {
  LOG_WARN("server " << server_id_ << ": " << msg);
  st.error = msg;
  st.acc.reset();
  st.reply_to.clear();
  if (broadcast_error_) broadcast_error_(h, msg);
}

void SumEngine::handle(PushWork& w) {
  const FrameHeader& h = w.hdr;
  uint64_t key = part_key(h.tensor, h.part);
  KeyState& st = keys_[key];
  if (!st.error.empty()) {
    // Already failed: tell this sender too, so it does not wait.
    FrameHeader e = h;
    e.type = static_cast<uint8_t>(MsgType::kError);
    e.sender = server_id_;
    e.len = st.error.size();
    auto msg = std::make_shared<std::string>(st.error);
    w.conn->send(e, msg->data(), msg->size(), [msg] {});
    return;
  }
  if (st.count == 0) {
    st.dtype = h.dtype;
    st.len = h.len;
    st.tensor_bytes = h.tensor_bytes;
    st.first_rank = h.sender;
    st.reply_to.assign(num_workers_, nullptr);
    if (h.round != st.round) {
      std::ostringstream os;
      os << "part " << h.part << " of tensor id " << h.tensor << ": worker " << h.sender
         << " pushed round " << h.round << " but the server is at round " << st.round
         << " (the workers do not run the same sequence of push_pulls)";
      fail(st, h, os.str());
      return;
    }
  } else if (h.dtype != st.dtype || h.len != st.len || h.tensor_bytes != st.tensor_bytes ||
             h.round != st.round) {
    std::ostringstream os;
    os << "mismatch in part " << h.part << " of tensor id " << h.tensor << ": worker "
       << st.first_rank << " pushed " << describe(st.dtype, st.len, st.tensor_bytes)
       << ", worker " << h.sender << " pushed " << describe(h.dtype, h.len, h.tensor_bytes);
    if (h.round != st.round) os << " (rounds " << st.round << " vs " << h.round << ")";
    fail(st, h, os.str());
    return;
  }
  if (st.reply_to[h.sender]) {
    std::ostringstream os;
    os << "worker " << h.sender << " pushed part " << h.part << " of tensor id " << h.tensor
       << " twice in round " << h.round;
    fail(st, h, os.str());
    return;
  }
  st.reply_to[h.sender] = w.conn;
  if (st.count == 0) {
    st.acc = std::move(w.data);  // the first push becomes the sum: no copy
  } else {
    size_t count = h.len / dtype_size(static_cast<DType>(h.dtype));
    sum_into(st.acc->data(), w.data->data(), count, static_cast<DType>(h.dtype));
    w.data.reset();
  }
  if (++st.count < num_workers_) return;

  FrameHeader r = h;
  r.type = static_cast<uint8_t>(MsgType::kResult);
  r.sender = server_id_;
  std::shared_ptr<Buffer> acc = std::move(st.acc);
  for (uint32_t i = 0; i < num_workers_; ++i) {
    // The buffer lives until the last reply is written.
    st.reply_to[i]->send(r, acc->data(), r.len, [acc] {});
  }
  st.count = 0;
  st.round++;
  std::fill(st.reply_to.begin(), st.reply_to.end(), nullptr);
  parts_summed_++;
}

}  // namespace fastps
