// Test helper: a worker's connection as a server sees it, recording every frame sent to it
// (no socket, nothing written), for tests that drive server-side code directly.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "protocol/messages.h"
#include "transport/connection.h"

namespace fastps {

class RecordingConn : public Connection {
 public:
  explicit RecordingConn(uint32_t rank)
      : Connection(Peer{rank, 0}, "worker " + std::to_string(rank)) {}
  bool send(const FrameHeader& h, const void* payload, size_t len,
            std::function<void()> on_sent) override {
    frames.push_back(h);
    payloads.emplace_back(len ? std::string(static_cast<const char*>(payload), len) : "");
    if (on_sent) on_sent();
    return true;
  }
  bool send_first(const FrameHeader& h) override { return send(h, nullptr, 0, nullptr); }
  bool closed() const override { return false; }
  bool idle() override { return true; }
  void shutdown_send() override {}
  void shutdown_both() override {}
  void set_pacing(double) override {}
  void count_bytes(std::atomic<uint64_t>*, std::atomic<uint64_t>*) override {}
  void count_unsent(std::atomic<int64_t>*) override {}

  // Frames of this type sent so far for part `part` of `tensor`.
  int count(MsgType type, uint64_t tensor, uint32_t part) const {
    int n = 0;
    for (auto& f : frames)
      if (f.type == static_cast<uint8_t>(type) && f.tensor == tensor && f.part == part) ++n;
    return n;
  }

  std::vector<FrameHeader> frames;
  std::vector<std::string> payloads;
};

}  // namespace fastps
