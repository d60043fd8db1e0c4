// Shared-memory segments for the colocated data path (BytePS §6.2). Each
// worker creates one segment; its local peers and colocated servers map it,
// then the name is unlinked so nothing is left behind even on SIGKILL.
//
// Layout: [header page][one uint32 reference count per data page][data pages].
// A slot is a page-aligned run of data pages; its count lives at its first
// page. Every process that still needs a slot holds one reference; the
// creating worker's ShmArena reuses a slot once its count is back to zero.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace fastps {

constexpr size_t kShmPage = 4096;

// "/fastps-<job id>-w<rank>": the shm_open name of worker rank's segment.
std::string shm_segment_name(const std::string& job_id, uint32_t rank);

class ShmSegment {
 public:
  // Claims the name exclusively (O_EXCL) and creates a segment with room for
  // data_bytes of slots, stamped with a fresh random nonce and the creator's pid.
  // A leftover of a dead creator is replaced; a live one's is a clash (two jobs
  // with one job id on this host): throws std::runtime_error naming it.
  static std::shared_ptr<ShmSegment> create(const std::string& name, size_t data_bytes);
  // Maps an existing segment whose nonce must be `nonce` (learnt from its
  // creator over an authenticated connection). Throws std::runtime_error if it
  // is missing, not a fastps segment, or another run's.
  static std::shared_ptr<ShmSegment> open(const std::string& name, uint64_t nonce);
  // Removes the name (mappings stay valid). Harmless if it is already gone.
  static void unlink(const std::string& name);

  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  const std::string& name() const { return name_; }
  uint64_t nonce() const { return nonce_; }
  size_t data_bytes() const { return data_bytes_; }
  char* at(uint64_t off) const { return data_ + off; }
  // True if [off, off+len) is a page-aligned range inside the data area.
  bool contains(uint64_t off, uint64_t len) const {
    return off % kShmPage == 0 && off <= data_bytes_ && len <= data_bytes_ - off;
  }
  // Reference count of the slot starting at off (page-aligned, inside).
  void ref(uint64_t off, uint32_t n);
  void unref(uint64_t off);
  uint32_t refs(uint64_t off) const;

 private:
  ShmSegment(std::string name, void* base, size_t map_bytes, size_t data_bytes);
  uint32_t* count_at(uint64_t off) const;

  std::string name_;
  uint64_t nonce_ = 0;
  void* base_;
  size_t map_bytes_;
  size_t data_bytes_;
  uint32_t* counts_;
  char* data_;
};

// The creating worker's allocator over its own segment. Thread-safe.
class ShmArena {
 public:
  explicit ShmArena(std::shared_ptr<ShmSegment> seg);
  // Offset of a free slot of at least len bytes, holding one reference (the
  // caller's); -1 if no run of free pages is large enough right now.
  int64_t alloc(size_t len);
  const std::shared_ptr<ShmSegment>& segment() const { return seg_; }
  size_t bytes_in_use();

 private:
  void reclaim_locked();
  void give_back_locked(uint64_t off, uint64_t len);

  std::shared_ptr<ShmSegment> seg_;
  std::mutex mu_;
  std::map<uint64_t, uint64_t> free_;  // offset -> length, coalesced
  std::map<uint64_t, uint64_t> used_;  // offset -> length
  size_t in_use_ = 0;
};

}  // namespace fastps
