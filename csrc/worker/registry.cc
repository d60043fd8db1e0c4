#include "worker/registry.h"

#include <stdexcept>

#include "common/errors.h"

namespace fastps {

uint64_t tensor_id_of(const std::string& name) {
  // FNV-1a, then a finalizer so similar names spread over all bits.
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

TensorEntry* TensorRegistry::begin(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    uint64_t id = tensor_id_of(name);
    auto clash = by_id_.find(id);
    if (clash != by_id_.end())
      throw Error("tensor names '" + name + "' and '" + clash->second->name +
                  "' hash to the same id; rename one of them");
    TensorEntry e;
    e.name = name;
    e.id = id;
    it = by_name_.emplace(name, std::move(e)).first;
    by_id_[id] = &it->second;
  }
  if (it->second.in_flight)
    throw Error("tensor '" + name +
                "' already has a push_pull in flight; synchronize it before "
                "starting another with the same name");
  it->second.in_flight = true;
  return &it->second;
}

void TensorRegistry::finish(TensorEntry* e, bool completed) {
  std::lock_guard<std::mutex> lock(mu_);
  e->in_flight = false;
  if (completed) e->rounds++;
}

const TensorEntry* TensorRegistry::find_id(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

std::string TensorRegistry::name_of(uint64_t id) const {
  const TensorEntry* e = find_id(id);
  return e ? e->name : "<unknown tensor id " + std::to_string(id) + ">";
}

size_t TensorRegistry::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_name_.size();
}

}  // namespace fastps
