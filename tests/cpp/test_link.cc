// The transport seam: a link sends a payload as a slot reference only when it
// lies in a slot its peer mapped, else as bytes; received_payload turns what
// arrived back into the same payload, and refuses references outside the
// mapped segments.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "frame_recorder.h"
#include "protocol/flags.h"
#include "transport/link.h"
#include "transport/payload.h"
#include "transport/shm.h"

namespace fastps {
namespace {

// One segment standing for "worker 3's", mapped by both ends of the test.
class OneSegment : public SlotSpace {
 public:
  explicit OneSegment(std::shared_ptr<ShmSegment> s) : seg(std::move(s)) {}
  Payload resolve(uint32_t segment, uint64_t offset, uint64_t len) const override {
    if (segment != 3 || !seg->contains(offset, len)) return Payload{};
    return Payload::slot(seg, segment, offset, len);
  }
  std::shared_ptr<ShmSegment> seg;
};

class LinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    name_ = shm_segment_name("cpptest-link-" + std::to_string(::getpid()), 3);
    seg_ = ShmSegment::create(name_, 16 * kShmPage);
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    tx_ = std::make_shared<TcpConnection>(sv[0], Peer{}, "tx", &null_);
    rx_ = std::make_shared<TcpConnection>(sv[1], Peer{}, "rx", &rec_);
    loop_.add(tx_);
    loop_.add(rx_);
    loop_.start();
  }
  void TearDown() override {
    loop_.stop();
    ShmSegment::unlink(name_);
  }
  FrameHeader header() const {
    FrameHeader h{};
    h.magic = kFrameMagic;
    h.type = 1;
    h.tensor = 42;
    return h;
  }
  Payload received(size_t i, const SlotSpace* slots) {
    return received_payload(rec_.frames[i], rec_.raw[i], rec_.holds[i], slots);
  }

  std::string name_;
  std::shared_ptr<ShmSegment> seg_;
  Null null_;
  Recorder rec_;
  EventLoop loop_{"test-link"};
  std::shared_ptr<TcpConnection> tx_, rx_;
};

TEST_F(LinkTest, ChoosesTheWayFromPayloadAndPeer) {
  Payload slot = Payload::slot(seg_, 3, 2 * kShmPage, 100);
  char bytes[8] = {};
  Payload mem = Payload::memory(bytes, sizeof bytes);
  Link mapped(tx_, true), unmapped(tx_, false);
  EXPECT_TRUE(mapped.by_slot(slot));
  EXPECT_FALSE(unmapped.by_slot(slot));  // the peer cannot read it: bytes
  EXPECT_FALSE(mapped.by_slot(mem));
  EXPECT_FALSE(mapped.by_slot(Payload::slot(seg_, 3, 0, 0)));  // nothing to reference
}

TEST_F(LinkTest, SlotTravelsAsReferenceAndResolvesToTheSameBytes) {
  Payload slot = Payload::slot(seg_, 3, 2 * kShmPage, 100);
  std::memset(slot.data, 0x5A, 100);
  ASSERT_TRUE(Link(tx_, true).send(header(), slot));
  ASSERT_TRUE(rec_.wait([&] { return rec_.frames.size() == 1; }));
  const FrameHeader& h = rec_.frames[0];
  EXPECT_TRUE(refers_to_slot(h));
  EXPECT_EQ(payload_bytes(h), 0u);
  EXPECT_EQ(h.len, 100u);
  EXPECT_TRUE(refers_to(h, slot));
  OneSegment space(seg_);
  Payload got = received(0, &space);
  ASSERT_TRUE(got.in_slot());
  EXPECT_TRUE(got.same_slot(slot));
  EXPECT_EQ(got.data, slot.data);
  EXPECT_EQ(got.len, 100u);
  // Without a slot space, or outside the segment, the reference is refused.
  EXPECT_FALSE(received(0, nullptr).in_slot());
  EXPECT_TRUE(received(0, nullptr).empty());
}

TEST_F(LinkTest, SlotTravelsAsBytesToAPeerThatDidNotMapIt) {
  Payload slot = Payload::slot(seg_, 3, 0, 5000);
  for (int i = 0; i < 5000; ++i) slot.data[i] = static_cast<char>(i);
  FrameHeader h = header();
  h.flags = kFlagShm;  // a stale flag must not survive
  ASSERT_TRUE(Link(tx_, false).send(h, slot));
  ASSERT_TRUE(rec_.wait([&] { return rec_.frames.size() == 1; }));
  EXPECT_FALSE(refers_to_slot(rec_.frames[0]));
  EXPECT_EQ(rec_.payloads[0], std::string(slot.data, 5000));
  Payload got = received(0, nullptr);
  EXPECT_FALSE(got.in_slot());
  EXPECT_EQ(got.len, 5000u);
  EXPECT_EQ(std::memcmp(got.data, slot.data, 5000), 0);
  EXPECT_TRUE(got.keep);  // held by the receive buffer
}

TEST_F(LinkTest, SlotFieldsWithoutTheFlagAreTheApplications) {
  char bytes[16] = {7};
  // A relayed push's route rides in the slot fields (protocol/flags.h): it goes out as is.
  FrameHeader relayed = header();
  RelayRoute route;
  route.owner = 5;
  route.owner_pushers = 3;
  set_relay_route(&relayed, route);
  ASSERT_TRUE(Link(tx_, true).send(relayed, Payload::memory(bytes, sizeof bytes)));
  // A slot reference copied from another frame is dropped, fields and flag, on either link.
  FrameHeader stale = header();
  stale.flags = kFlagShm | kFlagRelay;
  stale.shm_segment = 3;
  stale.shm_offset = kShmPage;
  ASSERT_TRUE(Link(tx_, true).send(stale, Payload::memory(bytes, sizeof bytes)));
  stale.flags = kFlagShm | kFlagNoPayload;
  stale.len = 12;
  ASSERT_TRUE(Link(tx_, false).send(stale, Payload{}));
  ASSERT_TRUE(rec_.wait([&] { return rec_.frames.size() == 3; }));
  EXPECT_EQ(rec_.frames[0].flags, kFlagRelay);
  EXPECT_EQ(relay_route(rec_.frames[0]).owner, 5u);
  EXPECT_EQ(relay_route(rec_.frames[0]).owner_pushers, 3u);
  EXPECT_EQ(rec_.payloads[0], std::string(bytes, sizeof bytes));
  EXPECT_EQ(rec_.frames[1].flags, kFlagRelay);
  EXPECT_EQ(rec_.frames[1].shm_segment, 0u);
  EXPECT_EQ(rec_.frames[1].shm_offset, 0u);
  EXPECT_EQ(rec_.payloads[1], std::string(bytes, sizeof bytes));
  // Header only: len stays the application's, nothing follows.
  EXPECT_EQ(rec_.frames[2].flags, kFlagNoPayload);
  EXPECT_EQ(rec_.frames[2].len, 12u);
  EXPECT_EQ(rec_.frames[2].shm_offset, 0u);
  EXPECT_EQ(rec_.payloads[2], "");
}

TEST_F(LinkTest, ReferenceOutsideTheSegmentIsRefused) {
  FrameHeader h = header();
  h.flags = kFlagShm;
  h.shm_segment = 3;
  h.shm_offset = 15 * kShmPage;
  h.len = 2 * kShmPage;  // runs past the end
  ASSERT_TRUE(tx_->send(h, nullptr, 0));
  h.shm_segment = 4;  // a segment nobody mapped
  h.len = 10;
  ASSERT_TRUE(tx_->send(h, nullptr, 0));
  ASSERT_TRUE(rec_.wait([&] { return rec_.frames.size() == 2; }));
  OneSegment space(seg_);
  EXPECT_TRUE(received(0, &space).empty());
  EXPECT_TRUE(received(1, &space).empty());
}

TEST_F(LinkTest, MemoryPayloadIsKeptAliveUntilWritten) {
  auto owner = std::make_shared<std::string>(1 << 20, 'q');
  std::weak_ptr<std::string> watch = owner;
  Payload p = Payload::memory(owner->data(), owner->size(), owner);
  owner.reset();
  std::atomic<bool> written{false};
  ASSERT_TRUE(Link(tx_, true).send(header(), p, [&] { written = true; }));
  p = Payload{};  // the link's copy alone keeps the bytes now
  ASSERT_TRUE(rec_.wait([&] { return rec_.frames.size() == 1; }));
  EXPECT_EQ(rec_.payloads[0], std::string(1 << 20, 'q'));
  // The sender runs its completion just after the last byte left: allow it a moment.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((!written.load() || !watch.expired()) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(written.load());
  EXPECT_TRUE(watch.expired());
}

TEST_F(LinkTest, SendFirstOvertakesQueuedFramesAndKeepsThemWhole) {
  // 8 frames of 8 MiB take far longer to drain than queuing one header does.
  auto bulk = std::make_shared<std::string>(8 << 20, 'b');
  for (int i = 0; i < 8; ++i) {
    FrameHeader h = header();
    h.part = static_cast<uint32_t>(i);
    ASSERT_TRUE(Link(tx_, false).send(h, Payload::memory(bulk->data(), bulk->size(), bulk)));
  }
  FrameHeader urgent = header();
  urgent.type = 11;
  urgent.part = 100;
  ASSERT_TRUE(tx_->send_first(urgent));
  ASSERT_TRUE(rec_.wait([&] { return rec_.frames.size() == 9; }));
  size_t at = 9;
  for (size_t i = 0; i < rec_.frames.size(); ++i) {
    if (rec_.frames[i].part == 100) {
      at = i;
      EXPECT_EQ(rec_.frames[i].type, 11);
      EXPECT_EQ(rec_.payloads[i], "");
    } else {
      EXPECT_EQ(rec_.payloads[i].size(), bulk->size());  // no frame cut by the overtaking one
      EXPECT_EQ(rec_.payloads[i].find_first_not_of('b'), std::string::npos);
    }
  }
  EXPECT_LT(at, 8u);  // ahead of the frames queued before it, not behind all of them
}

TEST(Payload, SlotReferenceCounts) {
  std::string name = shm_segment_name("cpptest-refs-" + std::to_string(::getpid()), 0);
  auto seg = ShmSegment::create(name, 4 * kShmPage);
  Payload s = Payload::slot(seg, 0, kShmPage, 10);
  uint32_t before = seg->refs(kShmPage);
  s.ref(2);
  EXPECT_EQ(seg->refs(kShmPage), before + 2);
  s.unref();
  EXPECT_EQ(seg->refs(kShmPage), before + 1);
  Payload m = Payload::memory(nullptr, 0);
  m.ref(5);  // no-ops for memory
  m.unref();
  ShmSegment::unlink(name);
}

// The unsent count a sender keeps over its connections (the server's pacing burst rule):
// a frame counts from when it is queued until its last byte is written, and what a closed
// connection never wrote is taken off.
TEST(UnsentBytes, CountFromQueueToWrittenAndDropOnClose) {
  int a[2], b[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, a), 0);
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, b), 0);
  Null null;
  Recorder rec;
  std::atomic<int64_t> unsent{0};
  auto tx = std::make_shared<TcpConnection>(a[0], Peer{}, "tx", &null);
  auto rx = std::make_shared<TcpConnection>(a[1], Peer{}, "rx", &rec);
  auto stuck = std::make_shared<TcpConnection>(b[0], Peer{}, "stuck", &null);  // b[1]: no reader
  tx->count_unsent(&unsent);
  stuck->count_unsent(&unsent);
  std::vector<char> big(8 << 20, 'x');
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.type = 1;
  h.len = static_cast<uint32_t>(big.size());
  const int64_t frame = static_cast<int64_t>(sizeof(FrameHeader) + big.size());
  {
    EventLoop loop("test-unsent");
    loop.add(tx);
    loop.add(stuck);
    loop.start();
    // Nobody reads yet: the socket buffers take a few hundred KiB, the rest waits.
    ASSERT_TRUE(tx->send(h, big.data(), big.size()));
    EXPECT_GT(unsent.load(), 0);
    EXPECT_LE(unsent.load(), frame);
    loop.add(rx);  // now tx's frame drains
    ASSERT_TRUE(rec.wait([&] { return rec.frames.size() == 1; }));
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (unsent.load() != 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(unsent.load(), 0);
    // Two frames to a peer that never reads: counted until the loop stops with them queued.
    ASSERT_TRUE(stuck->send(h, big.data(), big.size()));
    ASSERT_TRUE(stuck->send(h, big.data(), big.size()));
    EXPECT_GT(unsent.load(), frame);
    EXPECT_LE(unsent.load(), 2 * frame);
    loop.stop();
  }
  EXPECT_EQ(unsent.load(), 0);
  ::close(b[1]);
}

}  // namespace
}  // namespace fastps
