// Tensor fusion (Horovod's fusion buffer, in fastps's form): small tensors that
// are neighbours in the urgency order travel together as one tensor, a "bucket",
// so a thousand small gradients cost a few parts instead of a thousand.
//
// The plan is a pure function of the declared tensors (name, bytes, dtype,
// priority), so every worker that declares the same tensors builds the same
// buckets without talking to anyone. A bucket is pushed once every member of
// the round has arrived (no timer: a cycle time would make workers cut
// different buckets), with the priority of its most urgent member, so buckets
// keep their members' place in the priority order. Replacing a plan pushes the
// buckets it leaves half-filled with zeros where members are missing, so every
// worker must replace it at the same point of its work (after the same tensors).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/dtype.h"
#include "worker/handle.h"

namespace fastps {

struct FusionMember {
  std::string name;
  size_t nbytes = 0;
  DType dtype = DType::kFloat32;
  int priority = 0;
};

struct BucketPlan {
  std::string name;  // the bucket's tensor name: deterministic from its members
  DType dtype = DType::kFloat32;
  int priority = 0;  // its most urgent member's
  size_t nbytes = 0;
  std::vector<FusionMember> members;  // in urgency order
  std::vector<size_t> offsets;        // of each member in the bucket
};

// Packs members smaller than `capacity` into buckets of at most `capacity`
// bytes: members sorted by urgency (priority, then tensor id: the push queues'
// order), each run of consecutive same-dtype members cut when the next would not
// fit. Tensors of `capacity` bytes or more, empty ones, and buckets that would
// hold a single member are left out (they travel alone). Throws
// std::invalid_argument naming a tensor listed twice.
std::vector<BucketPlan> plan_fusion(const std::string& plan, std::vector<FusionMember> members,
                                    size_t capacity);

// One bucket's buffer and the members that arrived for its current round.
struct FusionBucket {
  explicit FusionBucket(BucketPlan p);
  BucketPlan plan;
  std::unique_ptr<char, void (*)(void*)> data;  // page-aligned, plan.nbytes (at least 1)
  // Guarded by Fuser::mu_.
  std::vector<std::shared_ptr<Handle>> waiting;  // by member index; null: not arrived
  size_t arrived = 0;
  // The round's first member says what it is: a sum, or a catch-up fetch (handle.h); the
  // others must agree.
  PushMode mode = PushMode::kSum;
  bool in_flight = false;  // pushed, its sum not back yet
  bool retired = false;    // its plan was replaced; pushed once more at most
  // Member names not arrived this round, for error messages.
  std::vector<std::string> missing() const;
};

class Fuser {
 public:
  // Replaces plan `plan` (empty buckets: removes it). Buckets of the old plan not in
  // the new one are retired, and so is another plan's bucket holding a tensor of the
  // new plan (the newest plan owns a tensor); those with members waiting are returned,
  // zero-filled where members are missing and marked in flight, for the caller to push.
  std::vector<std::shared_ptr<FusionBucket>> set_plan(const std::string& plan,
                                                      std::vector<BucketPlan> buckets);
  // Throws std::invalid_argument if tensor `id` belongs to a bucket planned for another
  // size or dtype (naming the tensor and the plan). False: not fused.
  bool check(uint64_t id, const std::string& name, size_t nbytes, DType dtype) const;
  // False if h's tensor is not fused. Else copies h's input into its bucket and sets
  // *full to the bucket if that completed it (then marked in flight, for the caller to
  // push); *why says why h cannot join its bucket (a plan changed under it).
  bool arrive(const std::shared_ptr<Handle>& h, std::shared_ptr<FusionBucket>* full,
              std::string* why);
  // The bucket's round ended: returns its members (null where missing) and opens the
  // next round.
  std::vector<std::shared_ptr<Handle>> end_round(FusionBucket* b);
  // Why a fused tensor may still be waiting (for timeout messages); empty if not fused.
  std::string describe_wait(uint64_t id) const;
  bool empty() const;

 private:
  struct Slot {
    std::shared_ptr<FusionBucket> bucket;
    size_t index = 0;
    std::string plan;
  };
  mutable std::mutex mu_;                     // a leaf: nothing else is locked while it is held
  std::unordered_map<uint64_t, Slot> slots_;  // tensor id -> its bucket
  std::unordered_map<std::string, std::vector<std::shared_ptr<FusionBucket>>> plans_;
};

}  // namespace fastps
