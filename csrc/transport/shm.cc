#include "transport/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <stdexcept>

namespace fastps {

namespace {

constexpr uint64_t kSegmentMagic = 0x314D485350534146ull;  // "FASPSHM1"

struct SegmentHeader {
  uint64_t magic;
  uint64_t data_bytes;
  uint64_t nonce;        // random per creation: peers check they mapped this run's segment
  uint64_t creator_pid;  // tells a dead run's leftover from a live clash
};

uint64_t random_nonce() {
  std::random_device rd;
  uint64_t n = 0;
  while (n == 0) n = (static_cast<uint64_t>(rd()) << 32) | rd();
  return n;
}

// True if the segment's creator is gone (or it never finished writing its header).
bool creator_dead(const std::string& name) {
  int fd = ::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return errno == ENOENT;
  SegmentHeader h{};
  ssize_t n = ::pread(fd, &h, sizeof(h), 0);
  ::close(fd);
  if (n != static_cast<ssize_t>(sizeof(h)) || h.magic != kSegmentMagic) return true;
  pid_t pid = static_cast<pid_t>(h.creator_pid);
  return pid <= 0 || (::kill(pid, 0) != 0 && errno == ESRCH);
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Bytes before the data area: header page plus the per-page counts.
size_t prefix_bytes(size_t data_bytes) {
  return kShmPage + round_up(data_bytes / kShmPage * sizeof(uint32_t), kShmPage);
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

std::string shm_segment_name(const std::string& job_id, uint32_t rank) {
  return "/fastps-" + job_id + "-w" + std::to_string(rank);
}

ShmSegment::ShmSegment(std::string name, void* base, size_t map_bytes, size_t data_bytes)
    : name_(std::move(name)), base_(base), map_bytes_(map_bytes), data_bytes_(data_bytes) {
  counts_ = reinterpret_cast<uint32_t*>(static_cast<char*>(base_) + kShmPage);
  data_ = static_cast<char*>(base_) + prefix_bytes(data_bytes_);
}

ShmSegment::~ShmSegment() { ::munmap(base_, map_bytes_); }

std::shared_ptr<ShmSegment> ShmSegment::create(const std::string& name, size_t data_bytes) {
  data_bytes = round_up(data_bytes < kShmPage ? kShmPage : data_bytes, kShmPage);
  size_t total = prefix_bytes(data_bytes) + data_bytes;
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST && creator_dead(name)) {
    ::shm_unlink(name.c_str());  // left behind by a crashed run: nobody uses it
    fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  }
  if (fd < 0 && errno == EEXIST)
    throw std::runtime_error("shared memory " + name +
                             " is in use by a live process of another job with the same job id "
                             "on this host; give each job its own FASTPS_JOB_ID");
  if (fd < 0) throw std::runtime_error("cannot create shared memory " + name + ": " + errno_text());
  if (::ftruncate(fd, static_cast<off_t>(total)) != 0) {
    std::string why = errno_text();
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw std::runtime_error("cannot size shared memory " + name + ": " + why);
  }
  void* base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    throw std::runtime_error("cannot map shared memory " + name + ": " + errno_text());
  }
  auto* h = static_cast<SegmentHeader*>(base);
  h->data_bytes = data_bytes;
  h->nonce = random_nonce();
  h->creator_pid = static_cast<uint64_t>(::getpid());
  __atomic_store_n(&h->magic, kSegmentMagic, __ATOMIC_RELEASE);
  auto seg = std::shared_ptr<ShmSegment>(new ShmSegment(name, base, total, data_bytes));
  seg->nonce_ = h->nonce;
  return seg;
}

std::shared_ptr<ShmSegment> ShmSegment::open(const std::string& name, uint64_t nonce) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error("cannot open shared memory " + name + ": " + errno_text());
  struct stat st{};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < 2 * kShmPage) {
    ::close(fd);
    throw std::runtime_error("shared memory " + name + " is not a fastps segment");
  }
  size_t total = static_cast<size_t>(st.st_size);
  void* base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED)
    throw std::runtime_error("cannot map shared memory " + name + ": " + errno_text());
  auto* h = static_cast<SegmentHeader*>(base);
  uint64_t data_bytes = h->data_bytes;
  if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != kSegmentMagic || data_bytes % kShmPage != 0 ||
      prefix_bytes(data_bytes) + data_bytes != total) {
    ::munmap(base, total);
    throw std::runtime_error("shared memory " + name + " is not a fastps segment");
  }
  if (h->nonce != nonce) {
    ::munmap(base, total);
    throw std::runtime_error("shared memory " + name +
                             " belongs to another run (its nonce differs from the one its owner "
                             "announced): is another job with the same job id on this host?");
  }
  auto seg = std::shared_ptr<ShmSegment>(new ShmSegment(name, base, total, data_bytes));
  seg->nonce_ = nonce;
  return seg;
}

void ShmSegment::unlink(const std::string& name) { ::shm_unlink(name.c_str()); }

uint32_t* ShmSegment::count_at(uint64_t off) const { return counts_ + off / kShmPage; }

void ShmSegment::ref(uint64_t off, uint32_t n) {
  __atomic_fetch_add(count_at(off), n, __ATOMIC_ACQ_REL);
}

void ShmSegment::unref(uint64_t off) { __atomic_fetch_sub(count_at(off), 1u, __ATOMIC_ACQ_REL); }

uint32_t ShmSegment::refs(uint64_t off) const {
  return __atomic_load_n(count_at(off), __ATOMIC_ACQUIRE);
}

ShmArena::ShmArena(std::shared_ptr<ShmSegment> seg) : seg_(std::move(seg)) {
  free_[0] = seg_->data_bytes();
}

void ShmArena::give_back_locked(uint64_t off, uint64_t len) {
  auto next = free_.lower_bound(off);
  if (next != free_.end() && off + len == next->first) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += len;
      return;
    }
  }
  free_[off] = len;
}

void ShmArena::reclaim_locked() {
  for (auto it = used_.begin(); it != used_.end();) {
    if (seg_->refs(it->first) == 0) {
      in_use_ -= it->second;
      give_back_locked(it->first, it->second);
      it = used_.erase(it);
    } else {
      ++it;
    }
  }
}

int64_t ShmArena::alloc(size_t len) {
  uint64_t need = round_up(len == 0 ? 1 : len, kShmPage);
  std::lock_guard<std::mutex> lock(mu_);
  reclaim_locked();
  // First fit: the lowest free run, so the pages in use stay few and warm.
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    uint64_t off = it->first;
    uint64_t rest = it->second - need;
    free_.erase(it);
    if (rest) free_[off + need] = rest;
    used_[off] = need;
    in_use_ += need;
    seg_->ref(off, 1);
    return static_cast<int64_t>(off);
  }
  return -1;
}

size_t ShmArena::bytes_in_use() {
  std::lock_guard<std::mutex> lock(mu_);
  reclaim_locked();
  return in_use_;
}

}  // namespace fastps
