// Page-aligned, reusable byte buffers. Parts of one job come in a few sizes,
// so buffers are recycled per exact capacity instead of malloc'ed per frame.
// The idle buffers of all sizes together stay under a byte budget: a job whose
// tensors come in many sizes must not keep one buffer of every size forever.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace fastps {

class BufferPool;

class Buffer {
 public:
  Buffer(void* data, size_t cap, std::shared_ptr<BufferPool> pool)
      : data_(data), cap_(cap), pool_(std::move(pool)) {}
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() const { return data_; }
  size_t capacity() const { return cap_; }

 private:
  void* data_;
  size_t cap_;
  std::shared_ptr<BufferPool> pool_;
};

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  static constexpr size_t kDefaultMaxIdleBytes = 64u << 20;
  explicit BufferPool(size_t max_idle_bytes = kDefaultMaxIdleBytes) : max_idle_(max_idle_bytes) {}
  ~BufferPool();
  // A buffer of at least len bytes (len rounded up to whole pages).
  std::shared_ptr<Buffer> get(size_t len);
  void put(void* data, size_t cap);
  // Idle bytes kept for reuse (at most max_idle_bytes).
  size_t bytes_held() const;

 private:
  // Frees idle buffers of other sizes, least recently returned size first,
  // until `need` more bytes fit the budget. Caller holds mu_.
  void evict_locked(size_t need, size_t keep_cap);

  const size_t max_idle_;
  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  std::unordered_map<size_t, uint64_t> last_put_;  // capacity -> put counter when last returned
  uint64_t puts_ = 0;
  size_t held_ = 0;
};

}  // namespace fastps
