// The part paths (worker/part_path.h): which path a push_pull takes for each push mode,
// routing and compression, and under rack routes; what each refuses; and the frame each
// pushes, sent on a Connection that records instead of writing to a socket.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "protocol/flags.h"
#include "protocol/messages.h"
#include "transport/connection.h"
#include "worker/part_path.h"

namespace fastps {
namespace {

// Keeps every frame handed to it; nothing is written, no callback runs.
class RecordingConnection : public Connection {
 public:
  explicit RecordingConnection(std::string desc) : Connection(Peer{}, std::move(desc)) {}
  bool send(const FrameHeader& h, const void* payload, size_t len,
            std::function<void()> on_sent) override {
    frames.push_back(h);
    bytes.push_back(payload ? std::string(static_cast<const char*>(payload), len) : "");
    return !is_closed;
  }
  bool send_first(const FrameHeader& h) override { return send(h, nullptr, 0, nullptr); }
  bool closed() const override { return is_closed; }
  bool idle() override { return true; }
  void shutdown_send() override {}
  void shutdown_both() override { is_closed = true; }
  void set_pacing(double) override {}
  void count_bytes(std::atomic<uint64_t>*, std::atomic<uint64_t>*) override {}
  void count_unsent(std::atomic<int64_t>*) override {}

  std::vector<FrameHeader> frames;
  std::vector<std::string> bytes;
  bool is_closed = false;
};

PushPullRequest request(PushMode mode, bool send = true, bool receive = true, uint32_t pushers = 0,
                        const std::string& compression = "") {
  PushPullRequest r;
  r.name = "t";
  r.nbytes = 64;
  r.mode = mode;
  r.send = send;
  r.receive = receive;
  r.pushers = pushers;
  r.compression = CompressionSpec::parse(compression);
  return r;
}

TEST(PartPath, KindFollowsModeRoutingAndCompression) {
  EXPECT_EQ(path_kind(request(PushMode::kSum)), PathKind::kPlain);
  EXPECT_EQ(path_kind(request(PushMode::kQuorumSum)), PathKind::kPlain);
  EXPECT_EQ(path_kind(request(PushMode::kSum, true, true, 0, "fp16")), PathKind::kCompressed);
  EXPECT_EQ(path_kind(request(PushMode::kQuorumSum, true, true, 0, "topk:0.1")),
            PathKind::kCompressed);
  // Routed: send or receive off, or pushers named; async modes travel as routed ones do.
  EXPECT_EQ(path_kind(request(PushMode::kSum, false, true, 2)), PathKind::kRouted);
  EXPECT_EQ(path_kind(request(PushMode::kSum, true, false, 2)), PathKind::kRouted);
  EXPECT_EQ(path_kind(request(PushMode::kSum, true, true, 2)), PathKind::kRouted);
  EXPECT_EQ(path_kind(request(PushMode::kAsyncUpdate)), PathKind::kRouted);
  EXPECT_EQ(path_kind(request(PushMode::kAsyncInit)), PathKind::kRouted);
  EXPECT_EQ(path_kind(request(PushMode::kAsyncRead, false)), PathKind::kRouted);
  // Routed and compressed: the routed path, whose check refuses the compression.
  EXPECT_EQ(path_kind(request(PushMode::kSum, true, true, 2, "fp16")), PathKind::kRouted);
  // A fetch is a fetch whatever else it asks (its own check refuses the rest).
  EXPECT_EQ(path_kind(request(PushMode::kQuorumFetch)), PathKind::kFetch);
  EXPECT_EQ(path_kind(request(PushMode::kQuorumFetch, false, true, 2, "fp16")), PathKind::kFetch);
  // Every push mode has a path, and a handle picks the one its request did.
  for (int m = 0; m < kPushModes; ++m) {
    auto r = request(static_cast<PushMode>(m));
    Handle h;
    h.mode = r.mode;
    EXPECT_EQ(path_kind(h), path_kind(r)) << "mode " << m;
  }
}

// A worker's options and paths over recording connections, one per server.
struct Paths {
  WorkerOptions opts;
  std::vector<std::vector<Link>> links;
  std::vector<std::shared_ptr<RecordingConnection>> conns;
  TensorRegistry registry;
  PartTable parts;
  HandleTable handles{&registry};
  ErrorFeedback feedback;
  WorkerStats stats;
  std::vector<std::string> aborts;
  std::unique_ptr<PartPaths> paths;
  TensorEntry* tensor = nullptr;
  std::vector<float> in = std::vector<float>(16, 1.5f);
  std::vector<float> out = std::vector<float>(16, 0.0f);

  explicit Paths(uint32_t servers, const std::function<void(WorkerOptions*)>& tune = nullptr) {
    opts.rank = 1;
    opts.num_workers = 4;
    for (uint32_t s = 0; s < servers; ++s) {
      opts.servers.push_back("127.0.0.1:" + std::to_string(9000 + s));
      conns.push_back(std::make_shared<RecordingConnection>("server " + std::to_string(s)));
      links.push_back({Link(conns.back(), false)});
    }
    if (tune) tune(&opts);
    PathContext ctx;
    ctx.opts = &opts;
    ctx.pushers = opts.num_workers;
    ctx.links = &links;
    ctx.parts = &parts;
    ctx.handles = &handles;
    ctx.registry = &registry;
    ctx.error_feedback = &feedback;
    ctx.stats = &stats;
    ctx.abort = [this](const std::string& why) { aborts.push_back(why); };
    paths = std::make_unique<PartPaths>(ctx);
    tensor = registry.begin("t");
    tensor->rounds = 7;
  }

  // Pushes part 0 of a 64-byte float32 tensor, owned by `server`, the way r asks; returns
  // the one frame that server's connection got.
  FrameHeader push(const PushPullRequest& r, uint32_t server, uint32_t* got_on = nullptr) {
    auto h = std::make_shared<Handle>();
    h->tensor = tensor;
    h->in = reinterpret_cast<const char*>(in.data());
    h->out = reinterpret_cast<char*>(out.data());
    h->nbytes = r.nbytes;
    h->send = r.send;
    h->receive = r.receive;
    h->pushers = r.pushers;
    h->mode = r.mode;
    h->compression = r.compression;
    h->path = &paths->of(*h);
    PartTask t;
    t.handle = h;
    t.span = PartSpan{0, 0, r.nbytes, server};
    t.in_flight = true;
    h->path->send(t);
    // The one connection that got a frame.
    FrameHeader got{};
    int grew = 0;
    for (uint32_t s = 0; s < conns.size(); ++s) {
      if (conns[s]->frames.size() == seen[s]) continue;
      grew += static_cast<int>(conns[s]->frames.size() - seen[s]);
      seen[s] = conns[s]->frames.size();
      got = conns[s]->frames.back();
      if (got_on) *got_on = s;
    }
    EXPECT_EQ(grew, 1);
    return got;
  }
  std::vector<size_t> seen = std::vector<size_t>(8, 0);  // frames per connection so far
};

TEST(PartPath, OneOfEachKindAndRelayedUnderRackRoutes) {
  Paths flat(2);
  EXPECT_STREQ(flat.paths->get(PathKind::kPlain).name(), "plain");
  EXPECT_STREQ(flat.paths->get(PathKind::kRouted).name(), "routed");
  EXPECT_STREQ(flat.paths->get(PathKind::kFetch).name(), "fetch");
  EXPECT_STREQ(flat.paths->get(PathKind::kCompressed).name(), "compressed");
  // Only routed and compressed parts skip fusion, the local reduce and staging slots.
  EXPECT_FALSE(flat.paths->get(PathKind::kPlain).direct());
  EXPECT_FALSE(flat.paths->get(PathKind::kFetch).direct());
  EXPECT_TRUE(flat.paths->get(PathKind::kRouted).direct());
  EXPECT_TRUE(flat.paths->get(PathKind::kCompressed).direct());
  Paths racks(2, [](WorkerOptions* o) {
    o->relay_via = {0, 0};
    o->owner_pushers = {3, 3};
    o->rack_pushers = 2;
  });
  EXPECT_STREQ(racks.paths->get(PathKind::kPlain).name(), "relayed");
  EXPECT_FALSE(racks.paths->get(PathKind::kPlain).direct());
  EXPECT_STREQ(racks.paths->of(request(PushMode::kQuorumSum)).name(), "relayed");
  // Routed, compressed and quorum fetches stay flat.
  EXPECT_STREQ(racks.paths->of(request(PushMode::kAsyncUpdate)).name(), "routed");
  EXPECT_STREQ(racks.paths->of(request(PushMode::kSum, true, true, 0, "fp16")).name(),
               "compressed");
}

void expect_refused(const PartPaths& paths, const PushPullRequest& r, const std::string& words) {
  try {
    paths.of(r).check(r);
    ADD_FAILURE() << "accepted; expected a refusal naming: " << words;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tensor 't'"), std::string::npos) << e.what();
  }
}

TEST(PartPath, EachPathRefusesWhatItCannotCarry) {
  Paths flat(2);
  const PartPaths& p = *flat.paths;
  EXPECT_NO_THROW(p.of(request(PushMode::kSum)).check(request(PushMode::kSum)));
  EXPECT_NO_THROW(
      p.of(request(PushMode::kSum, false, true, 2)).check(request(PushMode::kSum, false, true, 2)));
  // Routed.
  expect_refused(p, request(PushMode::kSum, false, false, 2), "must send its input or receive");
  expect_refused(p, request(PushMode::kSum, false, true, 0), "must name how many");
  expect_refused(p, request(PushMode::kSum, true, true, 5), "exceeds the job's 4 workers");
  expect_refused(p, request(PushMode::kSum, true, true, 2, "fp16"),
                 "a routed or async push_pull cannot be compressed");
  // Async.
  expect_refused(p, request(PushMode::kAsyncUpdate, true, true, 1), "names no pushers");
  expect_refused(p, request(PushMode::kAsyncRead, true), "none for a read");
  expect_refused(p, request(PushMode::kAsyncInit, true), "only rank 0 sets the value");
  // Compressed: float types only (checked before the path's own refusal).
  auto ints = request(PushMode::kSum, true, true, 0, "fp16");
  ints.dtype = DType::kInt32;
  expect_refused(p, ints, "float types only");
  ints.pushers = 2;
  expect_refused(p, ints, "float types only");
  EXPECT_NO_THROW(p.of(request(PushMode::kSum, true, true, 0, "fp16"))
                      .check(request(PushMode::kSum, true, true, 0, "fp16")));
  // Fetch: quorum rounds off here.
  expect_refused(p, request(PushMode::kQuorumFetch), "FASTPS_ROUND_QUORUM unset");
  Paths quorum(2, [](WorkerOptions* o) { o->quorum = true; });
  EXPECT_NO_THROW(
      quorum.paths->of(request(PushMode::kQuorumFetch)).check(request(PushMode::kQuorumFetch)));
  expect_refused(*quorum.paths, request(PushMode::kQuorumFetch, true, true, 0, "fp16"),
                 "no routing, no compression");
  Paths racks(2, [](WorkerOptions* o) {
    o->quorum = true;
    o->relay_via = {0, 0};
    o->owner_pushers = {3, 3};
  });
  expect_refused(*racks.paths, request(PushMode::kQuorumFetch), "rack relays sum it");
  // No servers: async and routed refuse, a plain sum is the input itself.
  Paths alone(0);
  expect_refused(*alone.paths, request(PushMode::kAsyncUpdate), "this job has none");
  expect_refused(*alone.paths, request(PushMode::kSum, true, true, 1), "needs servers");
  expect_refused(*alone.paths, request(PushMode::kQuorumFetch), "FASTPS_ROUND_QUORUM unset");
  EXPECT_NO_THROW(alone.paths->of(request(PushMode::kSum)).check(request(PushMode::kSum)));
}

TEST(PartPath, EachPathPushesItsOwnFrame) {
  Paths flat(2, [](WorkerOptions* o) { o->quorum = true; });
  std::string input(reinterpret_cast<const char*>(flat.in.data()), 64);

  FrameHeader h = flat.push(request(PushMode::kSum), 1);
  EXPECT_EQ(h.type, static_cast<uint8_t>(MsgType::kPush));
  EXPECT_EQ(h.flags, 0);  // exact sums wait for every push, even under quorum rounds
  EXPECT_EQ(h.pushers, 4u);
  EXPECT_EQ(h.len, 64u);
  EXPECT_EQ(h.round, 7u);
  EXPECT_EQ(h.sender, 1u);
  EXPECT_EQ(flat.conns[1]->bytes.back(), input);

  h = flat.push(request(PushMode::kQuorumSum), 0);
  EXPECT_EQ(h.flags, kFlagQuorum);

  h = flat.push(request(PushMode::kQuorumFetch), 0);
  EXPECT_EQ(h.flags, kFlagQuorum | kFlagNoData);
  EXPECT_EQ(h.len, 64u);  // the size of the part wanted; nothing follows
  EXPECT_EQ(payload_bytes(h), 0u);
  EXPECT_EQ(flat.conns[0]->bytes.back(), "");

  h = flat.push(request(PushMode::kSum, false, true, 3), 0);
  EXPECT_EQ(h.flags, kFlagNoData);
  EXPECT_EQ(h.pushers, 3u);
  h = flat.push(request(PushMode::kSum, true, false, 3), 0);
  EXPECT_EQ(h.flags, kFlagNoReply);
  EXPECT_EQ(flat.conns[0]->bytes.back(), input);
  h = flat.push(request(PushMode::kAsyncUpdate), 0);
  EXPECT_EQ(h.flags, kFlagAsync);
  h = flat.push(request(PushMode::kAsyncRead, false), 0);
  EXPECT_EQ(h.flags, kFlagAsync | kFlagNoData);
  h = flat.push(request(PushMode::kAsyncInit, true), 0);
  EXPECT_EQ(h.flags, kFlagAsyncInit);

  h = flat.push(request(PushMode::kSum, true, true, 0, "fp16"), 1);
  EXPECT_EQ(h.flags, kFlagCompressed);
  EXPECT_EQ(h.pushers, 0u);
  EXPECT_EQ(h.len, flat.conns[1]->bytes.back().size());
  EXPECT_LT(h.len, 64u + 64u);
  EXPECT_EQ(flat.stats.pushed_socket.load(), 3u);  // the two plain sums and this one
  EXPECT_EQ(flat.stats.pushed_routed.load(), 6u);
  EXPECT_TRUE(flat.aborts.empty());
}

TEST(PartPath, RelayedPartsGoToTheRackRelayWithTheirRoute) {
  // Servers 0 and 1 in this rack, server 2 in another: its parts go to relay 1.
  Paths racks(3, [](WorkerOptions* o) {
    o->relay_via = {0, 1, 1};
    o->owner_pushers = {2, 2, 3};
    o->rack_pushers = 2;
  });
  uint32_t at = 99;
  FrameHeader h = racks.push(request(PushMode::kSum), 2, &at);
  EXPECT_EQ(at, 1u);
  EXPECT_EQ(h.flags, kFlagRelay);
  EXPECT_EQ(h.pushers, 2u);  // what the relay waits for
  RelayRoute route = relay_route(h);
  EXPECT_EQ(route.owner, 2u);
  EXPECT_EQ(route.owner_pushers, 3u);
  EXPECT_EQ(payload_bytes(h), 64u);  // bytes, never a slot reference
  // A part of this rack's own server goes to it, plain.
  h = racks.push(request(PushMode::kSum), 0, &at);
  EXPECT_EQ(at, 0u);
  EXPECT_EQ(h.flags, 0);
  EXPECT_EQ(h.pushers, 2u);
  EXPECT_EQ(h.shm_segment, 0u);
  EXPECT_EQ(h.shm_offset, 0u);
}

TEST(PartPath, AClosedConnectionAbortsNamingIt) {
  Paths flat(1);
  flat.conns[0]->is_closed = true;
  flat.push(request(PushMode::kSum), 0);
  ASSERT_EQ(flat.aborts.size(), 1u);
  EXPECT_EQ(flat.aborts[0], "lost connection to server 0");
}

}  // namespace
}  // namespace fastps
