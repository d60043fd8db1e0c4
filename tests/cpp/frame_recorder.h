// Test helpers: frame handlers that record what arrives on a connection.
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/tcp.h"

namespace fastps {

// Receives every frame into its own buffer and records what arrived.
class Recorder : public FrameHandler {
 public:
  void* on_header(Connection* c, const FrameHeader& h, std::string* why) override {
    if (h.type == 99) {
      *why = "type 99 refused";
      return nullptr;
    }
    std::lock_guard<std::mutex> lock(mu);
    auto buf = std::make_shared<std::string>(payload_bytes(h), '\0');
    c->rx_hold = buf;  // what the receiving side would hold on to
    return buf->data();
  }
  void on_frame(Connection* c, const FrameHeader& h, void* payload) override {
    std::lock_guard<std::mutex> lock(mu);
    frames.push_back(h);
    raw.push_back(payload);
    holds.push_back(std::move(c->rx_hold));
    payloads.push_back(payload_bytes(h) ? std::string(static_cast<char*>(payload), h.len) : "");
    cv.notify_all();
  }
  void on_close(Connection*, bool clean, const std::string& reason) override {
    std::lock_guard<std::mutex> lock(mu);
    closed = true;
    close_reason = reason;
    cv.notify_all();
  }
  template <typename Pred>
  bool wait(Pred p) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(10), p);
  }
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> bufs;
  std::vector<FrameHeader> frames;
  std::vector<std::string> payloads;
  std::vector<void*> raw;                    // where each payload was received
  std::vector<std::shared_ptr<void>> holds;  // and what held it
  bool closed = false;
  std::string close_reason;
};

class Null : public FrameHandler {
 public:
  void* on_header(Connection*, const FrameHeader&, std::string*) override { return nullptr; }
  void on_frame(Connection*, const FrameHeader&, void*) override {}
  void on_close(Connection*, bool, const std::string&) override {}
};

}  // namespace fastps
