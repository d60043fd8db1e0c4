// Real servers and workers in one process, each worker on its own thread,
// over loopback TCP (and the host's shared memory): push_pull sums checked
// element by element on every data path.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/server.h"
#include "worker/worker.h"

namespace fastps {
namespace {

enum class Path { kTcp, kShm, kLocalReduceOneHost, kLocalReduceTwoHosts };

std::string path_name(Path p) {
  switch (p) {
    case Path::kTcp:
      return "tcp";
    case Path::kShm:
      return "shm";
    case Path::kLocalReduceOneHost:
      return "local_reduce_one_host";
    case Path::kLocalReduceTwoHosts:
      return "local_reduce_two_hosts";
  }
  return "?";
}

std::string unique_job() {
  static std::atomic<int> n{0};
  return "cpptest-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

// Servers plus the options each worker rank connects with.
struct Cluster {
  std::string job = unique_job();
  std::vector<std::unique_ptr<Server>> servers;
  std::vector<std::string> addrs;

  Cluster(uint32_t workers, uint32_t nservers, int engine_threads = 2) {
    for (uint32_t s = 0; s < nservers; ++s) {
      ServerOptions o;
      o.server_id = s;
      o.num_workers = workers;
      o.job_id = job;
      o.token = "secret";
      o.host = "127.0.0.1";
      o.port = 0;
      o.engine_threads = engine_threads;
      o.io_threads = 1;
      o.handshake_timeout_s = 5;
      o.max_pending_handshakes = 64;
      servers.push_back(std::make_unique<Server>(o));
      addrs.push_back("127.0.0.1:" + std::to_string(servers.back()->start()));
    }
  }

  // Hosts are emulated as in the Python tests: which ranks share shared memory.
  WorkerOptions options(uint32_t rank, uint32_t workers, Path path) const {
    WorkerOptions o;
    o.rank = rank;
    o.num_workers = workers;
    o.servers = addrs;
    o.job_id = job;
    o.token = "secret";
    o.partition_bytes = 64 << 10;
    o.credit_bytes = 128 << 10;
    o.window_bytes = 96 << 10;
    o.connect_timeout_s = 20;
    o.conns_per_server = 1;
    o.shm = true;  // the kTcp case turns it off
    o.shm_bytes = 8u << 20;
    o.local_servers.assign(addrs.size(), false);
    switch (path) {
      case Path::kTcp:
        o.shm = false;
        break;
      case Path::kShm:  // every worker alone on a host with all servers
        o.local_servers.assign(addrs.size(), true);
        o.local_ranks = {rank};
        o.num_hosts = workers;
        break;
      case Path::kLocalReduceOneHost:
        o.local_servers.assign(addrs.size(), true);
        for (uint32_t r = 0; r < workers; ++r) o.local_ranks.push_back(r);
        o.num_hosts = 1;
        break;
      case Path::kLocalReduceTwoHosts: {
        // Host A: ranks below half and server 0; host B: the rest and the other servers.
        bool host_a = rank < (workers + 1) / 2;
        for (uint32_t r = 0; r < workers; ++r)
          if ((r < (workers + 1) / 2) == host_a) o.local_ranks.push_back(r);
        for (size_t s = 0; s < addrs.size(); ++s) o.local_servers[s] = (s == 0) == host_a;
        o.num_hosts = 2;
        break;
      }
    }
    return o;
  }
};

// Runs fn(rank, worker) on one thread per worker, all started together; only
// the first `run` ranks of the job when run is set (the others never come).
void run_workers(const Cluster& c, uint32_t workers, Path path,
                 const std::function<void(uint32_t, Worker&)>& fn, uint32_t run = 0) {
  if (run == 0) run = workers;
  std::vector<std::unique_ptr<Worker>> ws(run);
  std::vector<std::thread> threads;
  std::mutex mu;
  std::vector<std::string> errors;
  for (uint32_t r = 0; r < run; ++r)
    threads.emplace_back([&, r] {
      try {
        ws[r] = std::make_unique<Worker>(c.options(r, workers, path));
        ws[r]->start();
        fn(r, *ws[r]);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back("worker " + std::to_string(r) + ": " + e.what());
      }
    });
  for (auto& t : threads) t.join();
  for (auto& w : ws)
    if (w) w->shutdown();
  for (auto& e : errors) ADD_FAILURE() << e;
}

// Waits for every handle. On the first failure the worker is shut down before
// the caller's buffers go away (its push thread may still read them), then the
// failure is rethrown.
void wait_all(Worker& w, const std::vector<int64_t>& ids) {
  std::string first;
  for (int64_t h : ids) {
    try {
      w.wait(h, first.empty() ? 60 : 5);
    } catch (const std::exception& e) {
      if (first.empty()) {
        first = e.what();
        w.abort(first);
      }
    }
  }
  if (!first.empty()) {
    w.shutdown();
    throw std::runtime_error(first);
  }
}

float value(uint32_t rank, size_t i, int round) {
  return static_cast<float>((rank + 1) * ((i % 97) + 1) + round);
}

class Loopback : public ::testing::TestWithParam<Path> {};

// Sums of float32 and int64 tensors of many sizes, three rounds, checked exactly.
void grouped_sums(Path path, int engine_threads) {
  const uint32_t workers = 3, nservers = 2;
  Cluster c(workers, nservers, engine_threads);
  // Sizes from one element to several parts per server.
  const std::vector<size_t> counts = {1, 1000, 40000, 300000};
  run_workers(c, workers, path, [&](uint32_t rank, Worker& w) {
    for (int round = 0; round < 3; ++round) {
      std::vector<std::vector<float>> f32(counts.size());
      std::vector<std::vector<int64_t>> i64(counts.size());
      std::vector<PushPullRequest> reqs;
      for (size_t k = 0; k < counts.size(); ++k) {
        f32[k].resize(counts[k]);
        i64[k].resize(counts[k]);
        for (size_t i = 0; i < counts[k]; ++i) {
          f32[k][i] = value(rank, i, round);
          i64[k][i] = static_cast<int64_t>(value(rank, i, round)) << 33;
        }
      }
      for (size_t k = 0; k < counts.size(); ++k) {
        // Workers list the tensors in different orders; priorities agree.
        size_t pos = (k + rank) % counts.size();
        reqs.push_back({f32[pos].data(), f32[pos].data(), counts[pos] * 4, DType::kFloat32,
                        "f32-" + std::to_string(pos), static_cast<int>(pos), 1.0});
        reqs.push_back({i64[pos].data(), i64[pos].data(), counts[pos] * 8, DType::kInt64,
                        "i64-" + std::to_string(pos), -static_cast<int>(pos), 1.0});
      }
      wait_all(w, w.push_pull_group(reqs));
      for (size_t k = 0; k < counts.size(); ++k)
        for (size_t i = 0; i < counts[k]; ++i) {
          float want = 0;
          for (uint32_t r = 0; r < workers; ++r) want += value(r, i, round);
          ASSERT_EQ(f32[k][i], want) << "f32 tensor " << k << " element " << i << " round " << round
                                     << " on worker " << rank;
          ASSERT_EQ(i64[k][i], static_cast<int64_t>(want) << 33)
              << "i64 tensor " << k << " element " << i << " round " << round;
        }
    }
  });
}

TEST_P(Loopback, GroupedPushPullSumsEveryDtypeOverRounds) { grouped_sums(GetParam(), 2); }

// engine_threads 0: each server sums on the thread that received the part.
TEST_P(Loopback, InlineSumsMatchThreadedSums) { grouped_sums(GetParam(), 0); }

TEST_P(Loopback, ScaledHalfPrecisionAverage) {
  const uint32_t workers = 2, nservers = 1;
  Cluster c(workers, nservers);
  run_workers(c, workers, GetParam(), [&](uint32_t rank, Worker& w) {
    // bfloat16 values 1..8 and 2..16: their sums and halves are exact.
    const size_t n = 50000;
    std::vector<uint16_t> in(n), out(n);
    for (size_t i = 0; i < n; ++i) {
      float v = static_cast<float>((rank + 1) * (1 + i % 8));
      uint32_t b;
      std::memcpy(&b, &v, 4);
      in[i] = static_cast<uint16_t>(b >> 16);
    }
    wait_all(w, {w.push_pull(in.data(), out.data(), n * 2, DType::kBFloat16, "bf16", 0, 0.5)});
    for (size_t i = 0; i < n; ++i) {
      uint32_t b = static_cast<uint32_t>(out[i]) << 16;
      float got;
      std::memcpy(&got, &b, 4);
      ASSERT_EQ(got, 1.5f * static_cast<float>(1 + i % 8)) << "element " << i;
    }
  });
}

// Routed parts: worker 0 forwards a block to every other worker (it wants no result),
// then every worker sends a block to its right neighbour only (two pushers per part),
// then all sum a tensor whose result only the last worker wants. Mixed in one group with
// a plain sum, so routed and local-reduce parts share the push scheduler.
TEST_P(Loopback, RoutedPartsForwardAndScatter) {
  const uint32_t workers = 3, nservers = 2;
  Cluster c(workers, nservers);
  run_workers(c, workers, GetParam(), [&](uint32_t rank, Worker& w) {
    const size_t n = 70000;  // several parts per server
    std::vector<float> block(n), got(n, -1.f), plain(n), rs_in(n), shard(n, -1.f);
    std::vector<std::vector<float>> ring_in(workers, std::vector<float>(n));
    std::vector<float> ring_out(n, -1.f);
    for (size_t i = 0; i < n; ++i) {
      block[i] = value(0, i, 7);
      plain[i] = value(rank, i, 0);
      rs_in[i] = plain[i];  // its own input: "plain" is summed in place meanwhile
      for (uint32_t r = 0; r < workers; ++r) ring_in[r][i] = value(r, i, 3);
    }
    uint32_t right = (rank + 1) % workers, left = (rank + workers - 1) % workers;
    std::vector<PushPullRequest> reqs;
    PushPullRequest fwd{block.data(), got.data(), n * 4, DType::kFloat32, "fwd", 0, 1.0};
    fwd.pushers = workers;
    fwd.send = rank == 0;
    fwd.receive = rank != 0;
    reqs.push_back(fwd);
    PushPullRequest out{ring_in[rank].data(),
                        ring_in[rank].data(),
                        n * 4,
                        DType::kFloat32,
                        "ring." + std::to_string(rank) + ">" + std::to_string(right),
                        1,
                        1.0};
    out.pushers = 2;
    out.receive = false;
    reqs.push_back(out);
    PushPullRequest in{ring_out.data(),
                       ring_out.data(),
                       n * 4,
                       DType::kFloat32,
                       "ring." + std::to_string(left) + ">" + std::to_string(rank),
                       1,
                       1.0};
    in.pushers = 2;
    in.send = false;
    reqs.push_back(in);
    PushPullRequest rs{rs_in.data(), shard.data(), n * 4, DType::kFloat32, "rs", 2, 0.5};
    rs.pushers = workers;
    rs.receive = rank == workers - 1;
    reqs.push_back(rs);
    reqs.push_back({plain.data(), plain.data(), n * 4, DType::kFloat32, "plain", 3, 1.0});
    wait_all(w, w.push_pull_group(reqs));
    for (size_t i = 0; i < n; ++i) {
      float sum = 0;
      for (uint32_t r = 0; r < workers; ++r) sum += value(r, i, 0);
      if (rank != 0) ASSERT_EQ(got[i], value(0, i, 7)) << "forwarded element " << i;
      ASSERT_EQ(ring_out[i], value(left, i, 3)) << "block from worker " << left << " element " << i;
      ASSERT_EQ(shard[i], rank == workers - 1 ? 0.5f * sum : -1.f) << "scattered element " << i;
      ASSERT_EQ(plain[i], sum) << "plain sum element " << i;
    }
    if (rank == 0) ASSERT_EQ(got[0], -1.f) << "the forwarding worker's output was written";
    EXPECT_GT(w.stats().pushed_routed.load(), 0u);
  });
}

INSTANTIATE_TEST_SUITE_P(Paths, Loopback,
                         ::testing::Values(Path::kTcp, Path::kShm, Path::kLocalReduceOneHost,
                                           Path::kLocalReduceTwoHosts),
                         [](const ::testing::TestParamInfo<Path>& info) {
                           return path_name(info.param);
                         });

TEST(LoopbackErrors, MismatchedSizesFailBothWorkersNamingTheTensor) {
  const uint32_t workers = 2;
  Cluster c(workers, 1);
  std::vector<std::string> errors(workers);
  run_workers(c, workers, Path::kTcp, [&](uint32_t rank, Worker& w) {
    std::vector<float> x(rank == 0 ? 1000 : 2000, 1.0f);
    int64_t h = w.push_pull(x.data(), x.data(), x.size() * 4, DType::kFloat32, "grad.w", 0, 1.0);
    try {
      w.wait(h, 30);
    } catch (const std::runtime_error& e) {
      errors[rank] = e.what();
    }
  });
  for (uint32_t r = 0; r < workers; ++r) {
    EXPECT_NE(errors[r].find("grad.w"), std::string::npos) << "worker " << r << ": " << errors[r];
    EXPECT_NE(errors[r].find("mismatch"), std::string::npos) << "worker " << r << ": " << errors[r];
  }
}

TEST(LoopbackErrors, MissingWorkerTimesOutNamingTheTensor) {
  Cluster c(2, 1);
  bool timed_out = false;
  run_workers(
      c, 2, Path::kTcp,
      [&](uint32_t, Worker& w) {
        // Worker 1 of 2 never connects: rank 0's push can never be answered.
        std::vector<float> x(10, 1.0f);
        int64_t h = w.push_pull(x.data(), x.data(), 40, DType::kFloat32, "lonely", 0, 1.0);
        try {
          w.wait(h, 0.5);
        } catch (const std::runtime_error& e) {
          timed_out = true;
          EXPECT_NE(std::string(e.what()).find("lonely"), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find("did not complete"), std::string::npos) << e.what();
        }
      },
      1);
  EXPECT_TRUE(timed_out) << "wait returned without the other worker";
}

}  // namespace
}  // namespace fastps
