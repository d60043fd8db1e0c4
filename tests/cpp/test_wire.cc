// The frame header's byte layout, part_key, and frames through a real
// connection pair (socketpair + event loop): header and payload arrive intact.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "frame_recorder.h"
#include "protocol/frame_check.h"
#include "protocol/messages.h"
#include "transport/socket.h"
#include "transport/tcp.h"
#include "transport/wire.h"

namespace fastps {
namespace {

template <typename T>
T read_le(const uint8_t* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(p[i]) << (8 * i);
  return v;
}

FrameHeader sample() {
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.type = static_cast<uint8_t>(MsgType::kPush);
  h.dtype = 3;
  h.flags = kFlagShm;
  h.sender = 0x01020304;
  h.part = 77;
  h.tensor = 0x1122334455667788ull;
  h.len = 4096;
  h.tensor_bytes = 1ull << 33;
  h.round = 9;
  h.shm_offset = 0xABCDEF000ull;
  h.shm_segment = 5;
  h.pushers = 2;
  return h;
}

TEST(Wire, HeaderEncodesLittleEndianAtFixedOffsets) {
  FrameHeader h = sample();
  uint8_t b[sizeof(FrameHeader)];
  std::memcpy(b, &h, sizeof b);
  EXPECT_EQ(sizeof(FrameHeader), 64u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b), 4), "FPSM");
  EXPECT_EQ(b[4], static_cast<uint8_t>(MsgType::kPush));
  EXPECT_EQ(b[5], 3);
  EXPECT_EQ(read_le<uint16_t>(b + 6), kFlagShm);
  EXPECT_EQ(read_le<uint32_t>(b + 8), 0x01020304u);
  EXPECT_EQ(read_le<uint32_t>(b + 12), 77u);
  EXPECT_EQ(read_le<uint64_t>(b + 16), 0x1122334455667788ull);
  EXPECT_EQ(read_le<uint64_t>(b + 24), 4096u);
  EXPECT_EQ(read_le<uint64_t>(b + 32), 1ull << 33);
  EXPECT_EQ(read_le<uint64_t>(b + 40), 9u);
  EXPECT_EQ(read_le<uint64_t>(b + 48), 0xABCDEF000ull);
  EXPECT_EQ(read_le<uint32_t>(b + 56), 5u);
  EXPECT_EQ(read_le<uint32_t>(b + 60), 2u);
  FrameHeader back;
  std::memcpy(&back, b, sizeof back);
  EXPECT_EQ(std::memcmp(&back, &h, sizeof h), 0);
}

TEST(Wire, ShmFramesCarryNoPayload) {
  FrameHeader h = sample();
  EXPECT_EQ(payload_bytes(h), 0u);
  h.flags = 0;
  EXPECT_EQ(payload_bytes(h), 4096u);
}

TEST(Wire, RoutedPushesAreCheckedBeforeUse) {
  FrameHeader h = sample();
  h.flags = kFlagNoData;  // want-only: len names the part, nothing follows
  EXPECT_EQ(payload_bytes(h), 0u);
  std::string why;
  h.sender = 1;
  EXPECT_TRUE(check_server_frame(h, 1, 4, &why)) << why;
  h.flags = kFlagNoReply;
  EXPECT_EQ(payload_bytes(h), 4096u);
  EXPECT_TRUE(check_server_frame(h, 1, 4, &why)) << why;
  for (uint16_t flags :
       {uint16_t(kFlagNoData | kFlagNoReply), uint16_t(kFlagNoData | kFlagShm),
        uint16_t(kFlagNoReply | kFlagShm), uint16_t(256), uint16_t(kFlagCompressed | kFlagNoData),
        uint16_t(kFlagCompressed | kFlagShm)}) {
    h.flags = flags;
    why.clear();
    EXPECT_FALSE(check_frame_header(h, &why)) << "flags " << flags;
    EXPECT_NE(why.find("flags"), std::string::npos) << why;
  }
  h.flags = kFlagNoData;
  h.type = static_cast<uint8_t>(MsgType::kResult);
  EXPECT_FALSE(check_frame_header(h, &why));
  EXPECT_NE(why.find("other than a push"), std::string::npos) << why;
}

TEST(Wire, RelayedPushesAreCheckedBeforeUse) {
  FrameHeader h = sample();
  h.sender = 1;
  h.flags = kFlagRelay;
  h.shm_segment = 3;  // the owner's server id: not a rank, so not checked against them
  h.shm_offset = 2;   // pushes the owner waits for
  std::string why;
  EXPECT_TRUE(check_server_frame(h, 1, 4, &why)) << why;
  EXPECT_EQ(payload_bytes(h), 4096u);  // relayed parts travel as bytes
  for (uint64_t bad_count : {0ull, 5ull}) {
    h.shm_offset = bad_count;
    why.clear();
    EXPECT_FALSE(check_server_frame(h, 1, 4, &why));
    EXPECT_NE(why.find("shm_offset"), std::string::npos) << why;
  }
  h.shm_offset = 2;
  for (uint16_t other : {kFlagShm, kFlagNoData, kFlagQuorum, kFlagCompressed, kFlagAsync}) {
    h.flags = kFlagRelay | other;
    why.clear();
    EXPECT_FALSE(check_frame_header(h, &why)) << "flags " << h.flags;
    EXPECT_NE(why.find("relayed"), std::string::npos) << why;
  }
  h.flags = kFlagRelay;
  h.type = static_cast<uint8_t>(MsgType::kResult);
  EXPECT_FALSE(check_frame_header(h, &why));
  EXPECT_NE(why.find("other than a push as relayed"), std::string::npos) << why;
}

TEST(Wire, RelayRouteRoundTripsAndAnswersDropIt) {
  FrameHeader h = sample();
  h.flags = 0;
  RelayRoute r;
  r.owner = 7;
  r.owner_pushers = 12;
  set_relay_route(&h, r);
  EXPECT_EQ(h.flags, kFlagRelay);
  EXPECT_EQ(relay_route(h).owner, 7u);
  EXPECT_EQ(relay_route(h).owner_pushers, 12u);
  // The rack's sum goes up to the owner as a plain push.
  FrameHeader up = h;
  clear_relay_route(&up);
  EXPECT_EQ(up.flags, 0);
  EXPECT_EQ(up.shm_segment, 0u);
  EXPECT_EQ(up.shm_offset, 0u);
  // An answer keeps the part's fields and nothing of how the push travelled.
  h.flags |= kFlagShm;
  FrameHeader a = answer_header(h, MsgType::kError, 3);
  EXPECT_EQ(a.type, static_cast<uint8_t>(MsgType::kError));
  EXPECT_EQ(a.sender, 3u);
  EXPECT_EQ(a.flags, 0);
  EXPECT_EQ(a.shm_segment, 0u);
  EXPECT_EQ(a.shm_offset, 0u);
  EXPECT_EQ(a.tensor, h.tensor);
  EXPECT_EQ(a.part, h.part);
  EXPECT_EQ(a.len, h.len);
  EXPECT_EQ(a.tensor_bytes, h.tensor_bytes);
  EXPECT_EQ(a.round, h.round);
  EXPECT_EQ(a.pushers, h.pushers);
  // The transport's flags are the only ones wire.h defines; the protocol's are disjoint
  // from kFlagShm, and its want-only push is the transport's header-only frame.
  EXPECT_EQ(kFlagNoData, kFlagNoPayload);
  EXPECT_EQ(kKnownFlags & kFlagShm, kFlagShm);
  EXPECT_EQ(
      (kFlagNoReply | kFlagQuorum | kFlagAsync | kFlagAsyncInit | kFlagCompressed | kFlagRelay) &
          (kFlagShm | kFlagNoPayload),
      0);
}

TEST(Wire, NudgesAreEmptyAndOnlyServersSendThem) {
  FrameHeader h = sample();
  h.type = static_cast<uint8_t>(MsgType::kNudge);
  h.flags = 0;
  h.len = 0;
  std::string why;
  EXPECT_TRUE(check_frame_header(h, &why)) << why;
  h.len = 8;  // a nudge carries nothing
  EXPECT_FALSE(check_frame_header(h, &why));
  EXPECT_NE(why.find("len"), std::string::npos) << why;
  h.len = 0;
  h.sender = 1;
  why.clear();
  EXPECT_FALSE(check_server_frame(h, 1, 4, &why));  // a worker may not send one
  EXPECT_NE(why.find("not a worker-to-server message"), std::string::npos) << why;
  h.type = static_cast<uint8_t>(MsgType::kNudge) + 1;
  why.clear();
  EXPECT_FALSE(check_frame_header(h, &why));
  EXPECT_NE(why.find("not a known message type"), std::string::npos) << why;
}

TEST(Wire, PartKeyIsStableAndSeparatesParts) {
  EXPECT_EQ(part_key(12345, 0), 12345u);
  EXPECT_EQ(part_key(12345, 7), part_key(12345, 7));
  std::set<uint64_t> keys;
  for (uint64_t t : {1ull, 2ull, 0xDEADBEEFull, 0x9E3779B97F4A7C15ull})
    for (uint32_t p = 0; p < 1000; ++p) keys.insert(part_key(t, p));
  EXPECT_EQ(keys.size(), 4000u);
}

TEST(Wire, FramesCrossAConnectionIntact) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  Recorder rx;
  Null tx_handler;
  EventLoop loop("test-wire");
  auto a = std::make_shared<TcpConnection>(sv[0], Peer{}, "a", &tx_handler);
  auto b = std::make_shared<TcpConnection>(sv[1], Peer{}, "b", &rx);
  loop.add(a);
  loop.add(b);
  loop.start();
  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + 7);
  FrameHeader h1 = sample();
  h1.flags = 0;
  h1.len = big.size();
  FrameHeader h2 = sample();  // shared-memory frame: header only
  std::atomic<int> sent{0};
  ASSERT_TRUE(a->send(h1, big.data(), big.size(), [&] { sent++; }));
  ASSERT_TRUE(a->send(h2, nullptr, 0, [&] { sent++; }));
  ASSERT_TRUE(rx.wait([&] { return rx.frames.size() == 2; }));
  EXPECT_EQ(std::memcmp(&rx.frames[0], &h1, sizeof h1), 0);
  EXPECT_EQ(rx.payloads[0], big);
  EXPECT_EQ(std::memcmp(&rx.frames[1], &h2, sizeof h2), 0);
  EXPECT_EQ(rx.payloads[1], "");
  // A frame the receiver refuses closes that connection, naming why.
  FrameHeader bad = sample();
  bad.flags = 0;
  bad.type = 99;
  bad.len = 8;
  ASSERT_TRUE(a->send(bad, "12345678", 8));
  ASSERT_TRUE(rx.wait([&] { return rx.closed; }));
  EXPECT_NE(rx.close_reason.find("type 99 refused"), std::string::npos) << rx.close_reason;
  loop.stop();
  EXPECT_EQ(sent.load(), 2);
}

// A connected TCP pair on loopback (the receive low-water mark only matters for TCP).
void tcp_pair(int* client, int* accepted) {
  int port = 0;
  int lfd = tcp_listen("127.0.0.1", 0, &port);
  *client = tcp_connect("127.0.0.1:" + std::to_string(port), 5);
  *accepted = ::accept(lfd, nullptr, nullptr);
  ::close(lfd);
  ASSERT_GE(*accepted, 0);
}

// The reader waits for the rest of a frame before waking (SO_RCVLOWAT). It must
// never wait for more than the frame owes: a frame whose last bytes come late
// still arrives, and so does a burst of small frames that outlasts one wake-up's
// round limit right after a large frame's tail set a high mark.
TEST(Wire, TcpReaderNeverWaitsForBytesNotOwed) {
  int cfd = -1, sfd = -1;
  tcp_pair(&cfd, &sfd);
  Recorder rx;
  EventLoop loop("test-lowat");
  auto b = std::make_shared<TcpConnection>(sfd, Peer{}, "b", &rx);
  loop.add(b);
  loop.start();
  FrameHeader h = sample();
  h.flags = 0;
  std::string big(2 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 31 + 3);
  h.len = big.size();
  auto pause = [] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); };
  // All but the last 100 bytes, then the rest: the reader waits for exactly those.
  ASSERT_TRUE(write_full(cfd, &h, sizeof h, 5));
  ASSERT_TRUE(write_full(cfd, big.data(), big.size() - 100, 5));
  pause();
  {
    std::lock_guard<std::mutex> lock(rx.mu);  // the loop thread writes frames
    EXPECT_TRUE(rx.frames.empty());
  }
  ASSERT_TRUE(write_full(cfd, big.data() + big.size() - 100, 100, 5));
  ASSERT_TRUE(rx.wait([&] { return rx.frames.size() == 1; }));
  EXPECT_EQ(rx.payloads[0], big);
  // The same frame again, 200 KB short, so the reader waits for 200 KB; then those
  // 200 KB and 200 small frames in one write. One wake-up takes the tail and 63
  // frames; the other 137 (10 KB) must not wait behind the old 200 KB mark.
  const size_t tail = 200 << 10;
  ASSERT_TRUE(write_full(cfd, &h, sizeof h, 5));
  ASSERT_TRUE(write_full(cfd, big.data(), big.size() - tail, 5));
  pause();
  std::string burst(big.data() + big.size() - tail, tail);
  std::vector<std::string> small;
  for (int i = 0; i < 200; ++i) {
    small.push_back("frame-" + std::to_string(i));
    FrameHeader s = h;
    s.len = small.back().size();
    burst.append(reinterpret_cast<const char*>(&s), sizeof s);
    burst += small.back();
  }
  ASSERT_TRUE(write_full(cfd, burst.data(), burst.size(), 5));
  ASSERT_TRUE(rx.wait([&] { return rx.frames.size() == 202; })) << rx.frames.size();
  EXPECT_EQ(rx.payloads[1], big);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(rx.payloads[2 + i], small[i]);
  loop.stop();
  ::close(cfd);
}

TEST(Wire, GarbageMagicClosesTheConnection) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  Recorder rx;
  EventLoop loop("test-wire");
  auto b = std::make_shared<TcpConnection>(sv[1], Peer{}, "b", &rx);
  loop.add(b);
  loop.start();
  FrameHeader h = sample();
  h.magic = 0x12345678;
  ASSERT_EQ(::write(sv[0], &h, sizeof h), static_cast<ssize_t>(sizeof h));
  ASSERT_TRUE(rx.wait([&] { return rx.closed; }));
  EXPECT_NE(rx.close_reason.find("malformed"), std::string::npos) << rx.close_reason;
  loop.stop();
  ::close(sv[0]);
}

}  // namespace
}  // namespace fastps
