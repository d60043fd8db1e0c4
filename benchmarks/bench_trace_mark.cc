// The cost of one timeline mark (csrc/common/trace.h), off and on, on one thread, in
// thread CPU time (a shared machine's load would otherwise count other processes' time):
//   g++ -O2 -std=c++17 -Icsrc benchmarks/bench_trace_mark.cc csrc/common/trace.cc
//       -lpthread -o /tmp/bench_trace_mark && /tmp/bench_trace_mark
// A part passes 6-9 marks on a worker and 4-6 on a server (docs/guide/timeline.md).
#include <time.h>

#include <cstdio>

#include "common/trace.h"

using namespace fastps;

static double cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static double ns_per_mark(int n) {
  double t0 = cpu_ns();
  for (int i = 0; i < n; ++i) {
    trace::mark(trace::Mark::kSend, static_cast<uint64_t>(i), static_cast<uint32_t>(i & 7), 1,
                1 << 20);
    // Keep the loop from being folded away when off: an opaque memory barrier.
    asm volatile("" ::: "memory");
  }
  return (cpu_ns() - t0) / n;
}

int main() {
  const int n = 1 << 22;  // fits one ring: nothing dropped while on
  double off = ns_per_mark(n);
  trace::enable(n);
  trace::mark(trace::Mark::kEnqueue, 0, 0, 0, 0);  // allocates the ring outside the timing
  trace::drain();
  double on = ns_per_mark(n);
  trace::disable();
  size_t drained = trace::drain().size() / sizeof(trace::Event);
  std::printf("off: %.2f ns/mark, on: %.2f ns/mark (%zu events recorded, %llu dropped)\n", off, on,
              drained, static_cast<unsigned long long>(trace::dropped()));
  return drained == static_cast<size_t>(n) ? 0 : 1;
}
