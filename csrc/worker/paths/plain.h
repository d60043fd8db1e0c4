// The plain sum of every worker's part (a gradient's, or an exact allreduce): staged in
// this worker's shared-memory segment when the part's server maps it, reduced on this
// host first when local peers exist (worker/local_reducer.h), else pushed from the
// caller's memory. The relayed path (paths/relayed.cc) is this one with a rack route.
#pragma once
#include "worker/part_path.h"

namespace fastps {

class PlainPath : public PartPath {
 public:
  using PartPath::PartPath;
  const char* name() const override { return "plain"; }
  bool direct() const override { return false; }
  // A plain sum is valid in every job.
  void check(const PushPullRequest&) const override {}
  void send(PartTask& t) const override;
  void take_result(Connection* c, const FrameHeader& h, const PartTask& t,
                   void* payload) const override;
};

}  // namespace fastps
