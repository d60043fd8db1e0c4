// What a caller asks of one push_pull (one tensor of a push_pull_group).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/dtype.h"
#include "compression/compressor.h"
#include "worker/handle.h"

namespace fastps {

struct PushPullRequest {
  const void* in = nullptr;
  void* out = nullptr;
  size_t nbytes = 0;
  DType dtype = DType::kFloat32;
  std::string name;
  int priority = 0;
  double scale = 1.0;
  // Routing (docs/design/architecture.md, "Bytes on the wire"): send = false pushes no data and
  // only receives the result into out; receive = false pushes in and wants no result;
  // pushers = how many workers push each part (0: all, the plain sum). A routed
  // push_pull goes straight to the servers (no local reduce, no staging slot).
  bool send = true;
  bool receive = true;
  uint32_t pushers = 0;
  PushMode mode = PushMode::kSum;  // async modes: docs/guide/async.md
  // Gradient compression (docs/guide/compression.md): each part is compressed before the push
  // and the server's compressed sum decoded into out. A compressed push_pull goes
  // straight to the servers, as a routed one does; float dtypes only.
  CompressionSpec compression{};
};

}  // namespace fastps
