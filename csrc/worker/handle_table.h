// The running push_pulls of a worker by handle id, and the two ways one ends:
// its last part's sum arrives, or it fails. Either way the tensor's name is
// freed in the registry for the next push_pull of it.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "worker/handle.h"
#include "worker/registry.h"

namespace fastps {

class HandleTable {
 public:
  explicit HandleTable(TensorRegistry* registry) : registry_(registry) {}
  // Gives h the next id and keeps it until released; returns the id.
  int64_t add(const std::shared_ptr<Handle>& h);
  // Throws std::invalid_argument naming the id if it is unknown or released.
  std::shared_ptr<Handle> get(int64_t id) const;
  void release(int64_t id);
  std::vector<std::shared_ptr<Handle>> all() const;

  // One part of h is in its output; the last one completes h.
  void part_done(const std::shared_ptr<Handle>& h);
  // h succeeded without moving parts (nothing to sum, or a single worker).
  void complete(const std::shared_ptr<Handle>& h);
  // h failed with msg, unless it already ended.
  void fail(const std::shared_ptr<Handle>& h, const std::string& msg, ErrorKind kind);

 private:
  TensorRegistry* registry_;
  // A leaf lock (handles' own locks and the registry's are taken after it is released).
  mutable std::mutex mu_;
  std::unordered_map<int64_t, std::shared_ptr<Handle>> handles_;
  int64_t next_id_ = 1;
};

}  // namespace fastps
