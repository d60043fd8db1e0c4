// Page-aligned, reusable byte buffers. Parts of one job come in a few sizes,
// so buffers are recycled per exact capacity instead of malloc'ed per frame.
#pragma once
#include <cstddef>
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
  ~BufferPool();
  // A buffer of at least len bytes (len rounded up to whole pages).
  std::shared_ptr<Buffer> get(size_t len);
  void put(void* data, size_t cap);
  size_t bytes_held() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t held_ = 0;
};

}  // namespace fastps
