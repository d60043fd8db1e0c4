// Tensor registry: name -> id, identical on every worker without talking to
// anyone (the id is a 64-bit hash of the name), plus per-tensor round state.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

namespace fastps {

uint64_t tensor_id_of(const std::string& name);

struct TensorEntry {
  std::string name;
  uint64_t id = 0;
  uint64_t rounds = 0;  // completed push_pulls of this name
  bool in_flight = false;
};

class TensorRegistry {
 public:
  // Marks the tensor busy and returns its entry (stable address). Throws
  // std::runtime_error if the name is already in flight or two names collide.
  TensorEntry* begin(const std::string& name);
  void finish(TensorEntry* e, bool completed);
  const TensorEntry* find_id(uint64_t id) const;
  std::string name_of(uint64_t id) const;
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, TensorEntry> by_name_;
  std::unordered_map<uint64_t, TensorEntry*> by_id_;
};

}  // namespace fastps
