// Where a part's bytes wait while they move through the worker's stages: a
// slot in some local worker's shared-memory segment, or (if no slot was free)
// a private buffer whose bytes then travel over a socket instead.
#pragma once
#include <cstdint>
#include <memory>

#include "common/buffer_pool.h"

namespace fastps {

constexpr uint32_t kNoSegment = 0xFFFFFFFFu;

struct Staging {
  char* data = nullptr;
  uint32_t segment = kNoSegment;  // rank of the worker whose segment holds it
  uint64_t offset = 0;
  std::shared_ptr<Buffer> heap;
  bool empty() const { return data == nullptr; }
  bool in_shm() const { return segment != kNoSegment; }
  bool same_slot(const Staging& o) const { return segment == o.segment && offset == o.offset; }
};

}  // namespace fastps
