// The server's side of gradient compression (docs/guide/compression.md): the compressed pushes
// of a part's round are decoded into one float32 sum, the sum is compressed again (with
// the server's own error feedback when the pushers asked for it: two-way compression)
// and every pusher gets that as its answer. Owned by one SumEngine, on its thread, so
// no lock guards a round. The pushers of a round must agree on the compression (codec,
// parameter, error feedback, element count, and random-k's seed); a disagreement fails
// the part on every worker, naming both settings.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "compression/error_feedback.h"
#include "compression/part_codec.h"
#include "protocol/messages.h"
#include "transport/connection.h"
#include "transport/payload.h"

namespace fastps {

class CompressedSum {
 public:
  using Fail = std::function<void(const FrameHeader&, const std::string&)>;
  // fail: tells every worker that this part failed (the engine's error broadcast).
  CompressedSum(uint32_t num_workers, uint32_t server_id, Fail fail);
  // Whether a compressed round of this part key has pushes waiting.
  bool pending(uint64_t key) const;
  // A push of a part whose round is compressed (or, if it is not compressed itself, a
  // push that disagrees with the waiting round: the part fails).
  void handle(const std::shared_ptr<Connection>& conn, const FrameHeader& h, const Payload& data);
  // Rounds answered so far.
  uint64_t parts_summed() const { return parts_summed_; }
  // Forgets the server-side residuals (the job's membership changed).
  void reset_error_feedback() { ef_.clear(); }

 private:
  struct Round {
    std::vector<float> acc;  // the decoded sum so far
    CompressedHeader first{};
    uint32_t first_rank = 0;
    uint32_t count = 0;
    uint32_t expected = 0;
    uint8_t dtype = 0;
    uint64_t tensor_bytes = 0;
    uint64_t round = 0;
    std::vector<std::shared_ptr<Connection>> reply_to;
  };
  void fail(uint64_t key, const FrameHeader& h, const std::string& msg);
  void complete(uint64_t key, Round& r, const FrameHeader& h);

  uint32_t num_workers_;
  uint32_t server_id_;
  Fail fail_;
  std::unordered_map<uint64_t, Round> rounds_;
  std::unordered_map<uint64_t, std::string> failed_;  // part key -> why
  ErrorFeedback ef_;
  uint64_t parts_summed_ = 0;
};

}  // namespace fastps
