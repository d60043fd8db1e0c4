// CPU cost of each compressor's part of a compressed round (docs/guide/compression.md), on one
// thread, in thread CPU time (the shared machine's load would otherwise count other
// processes' time): a worker's encode with error feedback, the server's decode of every
// worker's push into the sum and its encode of the sum with error feedback, and a
// worker's decode of the answer. Parts of 65,536 float32 values (256 KiB, the default
// partition), random normal gradients, 2 workers; each codec over its first 4 rounds (a
// short benchmark's, the server's residual still sparse) and over rounds 20-39 (steady):
//   g++ -O3 -std=c++17 -Icsrc benchmarks/bench_codecs.cc csrc/compression/*.cc csrc/common/dtype.cc
//       -lpthread -o /tmp/bench_codecs && /tmp/bench_codecs [spec ...]
#include <time.h>

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "compression/part_codec.h"

using namespace fastps;

static double cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char** argv) {
  std::vector<std::string> specs;
  for (int i = 1; i < argc; ++i) specs.emplace_back(argv[i]);
  if (specs.empty())
    specs = {"fp16",
             "onebit:ef",
             "topk:0.01:ef",
             "topk:0.01",
             "topk:0.01:ef:momentum=0.9",
             "randomk:0.01:ef",
             "dithering:16:ef"};
  const size_t n = 65536, workers = 2, parts = 16, rounds = 40;
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 0.01f);
  std::vector<std::vector<float>> grads(workers * parts, std::vector<float>(n));
  for (auto& g : grads)
    for (auto& v : g) v = normal(gen);
  std::printf("%-26s %6s %9s %9s %9s %9s   (ns per value, parts of %zu values)\n", "spec", "rounds",
              "w.encode", "s.decode", "s.encode", "w.decode", n);
  for (const auto& text : specs)
    for (bool early : {true, false}) {
      CompressionSpec spec = CompressionSpec::parse(text);
      ErrorFeedback worker_ef[workers], server_ef;
      std::vector<float> sum(n), out(n);
      double t_wenc = 0, t_sdec = 0, t_senc = 0, t_wdec = 0;
      size_t measured = 0;
      for (size_t round = 0; round < (early ? 4 : rounds); ++round) {
        for (size_t p = 0; p < parts; ++p) {
          bool timed = early ? round < 4 : round >= rounds / 2;
          std::vector<std::shared_ptr<std::vector<char>>> pushed(workers);
          double t0 = cpu_ns();
          for (size_t w = 0; w < workers; ++w)
            pushed[w] = encode_part(spec, grads[w * parts + p].data(), DType::kFloat32, n,
                                    round_seed(spec, p, round, static_cast<uint32_t>(w)),
                                    spec.error_feedback ? &worker_ef[w] : nullptr, p);
          double t1 = cpu_ns();
          for (size_t w = 0; w < workers; ++w)
            decode_part(pushed[w]->data(), pushed[w]->size(), n, sum.data(), w > 0);
          double t2 = cpu_ns();
          uint64_t seed = spec.codec == Codec::kRandomK ? round_seed(spec, p, round, 0)
                                                        : round_seed(spec, p, round, 0xFFFFFFFFu);
          auto answer = encode_part(spec, sum.data(), DType::kFloat32, n, seed,
                                    spec.error_feedback ? &server_ef : nullptr, p);
          double t3 = cpu_ns();
          decode_part(answer->data(), answer->size(), n, out.data(), false);
          double t4 = cpu_ns();
          if (timed) {
            t_wenc += (t1 - t0) / workers;
            t_sdec += (t2 - t1) / workers;
            t_senc += t3 - t2;
            t_wdec += t4 - t3;
            ++measured;
          }
        }
      }
      double per = static_cast<double>(measured) * n;
      std::printf("%-26s %6s %9.3f %9.3f %9.3f %9.3f\n", text.c_str(), early ? "0-3" : "20-39",
                  t_wenc / per, t_sdec / per, t_senc / per, t_wdec / per);
    }
  return 0;
}
