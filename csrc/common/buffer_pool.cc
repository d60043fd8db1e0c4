#include "common/buffer_pool.h"

#include <cstdlib>
#include <new>

namespace fastps {

namespace {
constexpr size_t kPage = 4096;
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
      if (it->second.empty()) {  // no entry per size ever seen: the maps stay small
        free_.erase(it);
        last_put_.erase(cap);
      }
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
  last_put_[cap] = ++puts_;
  if (held_ + cap > max_idle_) evict_locked(cap, cap);
  if (held_ + cap > max_idle_) {
    std::free(data);  // this size alone fills the budget
    if (!free_.count(cap)) last_put_.erase(cap);
    return;
  }
  free_[cap].push_back(data);
  held_ += cap;
}

void BufferPool::evict_locked(size_t need, size_t keep_cap) {
  while (held_ + need > max_idle_) {
    // The size returned least recently is the least likely to be asked for again.
    size_t victim = 0;
    uint64_t oldest = UINT64_MAX;
    for (auto& kv : free_) {
      if (kv.first == keep_cap || kv.second.empty()) continue;
      uint64_t t = last_put_[kv.first];
      if (t < oldest) {
        oldest = t;
        victim = kv.first;
      }
    }
    if (victim == 0) return;
    auto it = free_.find(victim);
    for (void* p : it->second) std::free(p);
    held_ -= victim * it->second.size();
    free_.erase(it);
    last_put_.erase(victim);
  }
}

size_t BufferPool::bytes_held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

}  // namespace fastps
