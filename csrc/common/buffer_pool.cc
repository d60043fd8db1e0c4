#include "common/buffer_pool.h"

#include <cstdlib>
#include <new>

namespace fastps {

namespace {
constexpr size_t kPage = 4096;
// Keep at most this many idle bytes per capacity class; the rest is freed.
constexpr size_t kMaxIdlePerClass = 256u << 20;
}  // namespace

Buffer::~Buffer() { pool_->put(data_, cap_); }

BufferPool::~BufferPool() {
  for (auto& kv : free_)
    for (void* p : kv.second) std::free(p);
}

std::shared_ptr<Buffer> BufferPool::get(size_t len) {
  size_t cap = ((len == 0 ? 1 : len) + kPage - 1) / kPage * kPage;
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(cap);
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      held_ -= cap;
    }
  }
  if (!p) {
    p = std::aligned_alloc(kPage, cap);
    if (!p) throw std::bad_alloc();
  }
  return std::make_shared<Buffer>(p, cap, shared_from_this());
}

void BufferPool::put(void* data, size_t cap) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& list = free_[cap];
  if ((list.size() + 1) * cap > kMaxIdlePerClass && !list.empty()) {
    std::free(data);
    return;
  }
  list.push_back(data);
  held_ += cap;
}

size_t BufferPool::bytes_held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

}  // namespace fastps
