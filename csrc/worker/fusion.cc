#include "worker/fusion.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <unordered_set>

#include "worker/registry.h"

namespace fastps {

namespace {

std::string bucket_name(const std::string& plan, const BucketPlan& b) {
  // Deterministic from the content, so workers agree and a changed bucket gets a new name.
  return "fastps.fusion:" + plan + ":" + b.members.front().name + ".." + b.members.back().name +
         ":" + std::to_string(b.members.size()) + "x" + std::to_string(b.nbytes) + "B";
}

void close_bucket(const std::string& plan, BucketPlan* cur, std::vector<BucketPlan>* out) {
  if (cur->members.size() >= 2) {
    cur->name = bucket_name(plan, *cur);
    out->push_back(std::move(*cur));
  }
  *cur = BucketPlan{};
}

char* page_aligned(size_t n) {
  size_t bytes = ((std::max<size_t>(n, 1) + 4095) / 4096) * 4096;
  void* p = std::aligned_alloc(4096, bytes);
  if (!p) throw std::bad_alloc();
  return static_cast<char*>(p);
}

bool same_members(const BucketPlan& a, const BucketPlan& b) {
  if (a.name != b.name || a.dtype != b.dtype || a.priority != b.priority ||
      a.members.size() != b.members.size())
    return false;
  for (size_t i = 0; i < a.members.size(); ++i)
    if (a.members[i].name != b.members[i].name || a.members[i].nbytes != b.members[i].nbytes ||
        a.offsets[i] != b.offsets[i])
      return false;
  return true;
}

}  // namespace

std::vector<BucketPlan> plan_fusion(const std::string& plan, std::vector<FusionMember> members,
                                    size_t capacity) {
  std::unordered_set<std::string> seen;
  for (auto& m : members)
    if (!seen.insert(m.name).second)
      throw std::invalid_argument("fusion plan '" + plan + "': tensor '" + m.name +
                                  "' is listed twice");
  std::vector<std::pair<uint64_t, FusionMember>> order;
  order.reserve(members.size());
  for (auto& m : members) order.emplace_back(tensor_id_of(m.name), std::move(m));
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    if (a.second.priority != b.second.priority) return a.second.priority > b.second.priority;
    return a.first < b.first;
  });
  std::vector<BucketPlan> out;
  BucketPlan cur;
  for (auto& [id, m] : order) {
    if (m.nbytes == 0 || m.nbytes >= capacity) {
      // It travels alone, and so its neighbours in the order cannot close the gap.
      close_bucket(plan, &cur, &out);
      continue;
    }
    if (!cur.members.empty() && (m.dtype != cur.dtype || cur.nbytes + m.nbytes > capacity))
      close_bucket(plan, &cur, &out);
    if (cur.members.empty()) {
      cur.dtype = m.dtype;
      cur.priority = m.priority;
    }
    cur.offsets.push_back(cur.nbytes);
    cur.nbytes += m.nbytes;
    cur.members.push_back(std::move(m));
  }
  close_bucket(plan, &cur, &out);
  return out;
}

FusionBucket::FusionBucket(BucketPlan p)
    : plan(std::move(p)), data(page_aligned(plan.nbytes), std::free) {
  waiting.resize(plan.members.size());
}

std::vector<std::string> FusionBucket::missing() const {
  std::vector<std::string> out;
  for (size_t i = 0; i < waiting.size(); ++i)
    if (!waiting[i]) out.push_back(plan.members[i].name);
  return out;
}

std::vector<std::shared_ptr<FusionBucket>> Fuser::set_plan(const std::string& plan,
                                                           std::vector<BucketPlan> buckets) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<FusionBucket>> dropped;
  auto pit = plans_.find(plan);
  std::vector<std::shared_ptr<FusionBucket>> old;
  if (pit != plans_.end()) old = std::move(pit->second);
  // The newest plan owns a tensor: another plan's bucket holding one is dropped whole.
  std::unordered_set<FusionBucket*> taken;
  for (auto& b : buckets)
    for (auto& m : b.members) {
      auto it = slots_.find(tensor_id_of(m.name));
      if (it == slots_.end() || it->second.plan == plan) continue;
      auto& theirs = plans_[it->second.plan];
      if (!taken.insert(it->second.bucket.get()).second) continue;
      dropped.push_back(it->second.bucket);
      theirs.erase(std::find(theirs.begin(), theirs.end(), it->second.bucket));
      if (theirs.empty()) plans_.erase(it->second.plan);
    }
  for (auto it = slots_.begin(); it != slots_.end();)
    it = it->second.plan == plan || taken.count(it->second.bucket.get()) ? slots_.erase(it)
                                                                         : std::next(it);
  std::vector<std::shared_ptr<FusionBucket>> now;
  std::unordered_set<FusionBucket*> kept;
  for (auto& b : buckets) {
    std::shared_ptr<FusionBucket> bucket;
    for (auto& o : old)
      if (same_members(o->plan, b)) bucket = o;  // unchanged: keeps its round
    if (!bucket) bucket = std::make_shared<FusionBucket>(std::move(b));
    kept.insert(bucket.get());
    for (size_t i = 0; i < bucket->plan.members.size(); ++i)
      slots_[tensor_id_of(bucket->plan.members[i].name)] = Slot{bucket, i, plan};
    now.push_back(std::move(bucket));
  }
  for (auto& o : old)
    if (!kept.count(o.get())) dropped.push_back(o);
  std::vector<std::shared_ptr<FusionBucket>> flush;
  for (auto& o : dropped) {
    o->retired = true;
    if (o->arrived == 0 || o->in_flight) continue;
    for (size_t i = 0; i < o->waiting.size(); ++i)
      if (!o->waiting[i])
        std::memset(o->data.get() + o->plan.offsets[i], 0, o->plan.members[i].nbytes);
    o->in_flight = true;
    flush.push_back(o);
  }
  if (now.empty())
    plans_.erase(plan);
  else
    plans_[plan] = std::move(now);
  return flush;
}

bool Fuser::check(uint64_t id, const std::string& name, size_t nbytes, DType dtype) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(id);
  if (it == slots_.end()) return false;
  const FusionBucket& b = *it->second.bucket;
  const FusionMember& m = b.plan.members[it->second.index];
  if (m.nbytes != nbytes || m.dtype != dtype)
    throw std::invalid_argument(
        "tensor '" + name + "': fusion plan '" + it->second.plan + "' fuses it as " +
        std::to_string(m.nbytes) + " bytes of " + dtype_name(m.dtype) + ", but it came with " +
        std::to_string(nbytes) + " bytes of " + dtype_name(dtype) +
        "; set the fusion plan again (on every worker) after a tensor changes");
  return true;
}

bool Fuser::arrive(const std::shared_ptr<Handle>& h, std::shared_ptr<FusionBucket>* full,
                   std::string* why) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(h->tensor->id);
  if (it == slots_.end()) return false;
  FusionBucket& b = *it->second.bucket;
  size_t i = it->second.index;
  const FusionMember& m = b.plan.members[i];
  if (m.nbytes != h->nbytes || m.dtype != h->dtype) {
    *why = "tensor '" + h->tensor->name + "': fusion plan '" + it->second.plan +
           "' changed while it was being submitted";
    return true;
  }
  if (b.in_flight || b.waiting[i]) {
    *why = "tensor '" + h->tensor->name + "' arrived for fusion bucket '" + b.plan.name +
           "' while that bucket's previous round is running";
    return true;
  }
  if (b.arrived == 0) {
    b.mode = h->mode;
  } else if (b.mode != h->mode) {
    *why = "tensor '" + h->tensor->name + "' arrived for fusion bucket '" + b.plan.name + "' as " +
           push_mode_text(h->mode) + " while the bucket's round is " + push_mode_text(b.mode) +
           " (every tensor of a bucket travels alike: fetch every tensor of a step's round, or "
           "none)";
    return true;
  }
  if (h->nbytes && !h->fetch()) std::memcpy(b.data.get() + b.plan.offsets[i], h->in, h->nbytes);
  b.waiting[i] = h;
  if (++b.arrived == b.waiting.size()) {
    b.in_flight = true;
    *full = it->second.bucket;
  }
  return true;
}

std::vector<std::shared_ptr<Handle>> Fuser::end_round(FusionBucket* b) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Handle>> out(b->waiting.size());
  out.swap(b->waiting);
  b->arrived = 0;
  b->in_flight = false;
  return out;
}

std::string Fuser::describe_wait(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(id);
  if (it == slots_.end()) return "";
  const FusionBucket& b = *it->second.bucket;
  std::string s = "; it travels fused with " + std::to_string(b.plan.members.size() - 1) +
                  " other tensors as '" + b.plan.name + "'";
  if (b.in_flight) return s + ", which is being summed";
  auto miss = b.missing();
  s += ", which waits for tensors not submitted on this worker yet: ";
  for (size_t i = 0; i < miss.size() && i < 5; ++i) s += (i ? ", '" : "'") + miss[i] + "'";
  if (miss.size() > 5) s += ", ... (" + std::to_string(miss.size()) + " in all)";
  return s;
}

bool Fuser::empty() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_.empty();
}

}  // namespace fastps
