// parallel_for: splits a large elementwise loop across the CPU's cores (for CPU kernels).
//
//   parallel_for(n, kGrain, [&](int64_t begin, int64_t end) { ... elements [begin, end) ... });
//
// Below `grain` elements per thread the body runs inline on the caller (waking a thread costs
// microseconds). Chunks are disjoint and each element is computed by exactly one thread, so
// an elementwise kernel gives bit-identical results at any thread count. The body must not
// throw. Threads: one per core; ENCORE_NUM_THREADS=1 (or set_num_threads(1)) turns it off.
//
// The chunks of a loop are a function of n, grain and num_threads() only, whoever runs them: a
// kernel whose result depends on the split (a GEMM split into parts) gives the same bits
// wherever it runs, on the pool or inside a schedule's lanes (LanePair, below).
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>

namespace encore {

namespace detail {
using RangeFn = void (*)(void* ctx, int64_t begin, int64_t end);
void parallel_run(int64_t n, int64_t grain, RangeFn fn, void* ctx);

// A range function over [0, n) split into `parts` chunks, chunk i [n i / parts, n (i + 1) /
// parts): the pool's split, and the lanes'.
struct RangeTask {
  RangeFn fn = nullptr;
  void* ctx = nullptr;
  int64_t n = 0;
  int parts = 1;
  // Runs chunks first, first + step, ... on the calling thread, in order.
  void run_chunks(int first, int step) const;
};
}  // namespace detail

template <typename Body>
void parallel_for(int64_t n, int64_t grain, Body&& body) {
  detail::parallel_run(
      n, grain, [](void* ctx, int64_t b, int64_t e) { (*static_cast<Body*>(ctx))(b, e); },
      static_cast<void*>(&body));
}

// Threads parallel_for may use, the caller included (at least 1; default: one per core, or
// ENCORE_NUM_THREADS). encore runs OpenBLAS on one thread and splits GEMMs itself.
int num_threads();
void set_num_threads(int n);

// How many chunks parallel_for(n, grain, ...) splits [0, n) into at the current thread count;
// chunk i is [n i / parts, n (i + 1) / parts).
int parallel_parts(int64_t n, int64_t grain);

// One turn of a wait for another thread that is running: a pause instruction for the first
// turns (a few tens of microseconds: the other thread is usually about to finish), then a yield
// of the core, in case the thread waited for shares it (more threads than cores).
class SpinWait {
 public:
  void operator()();

 private:
  int turns_ = 0;
};

// Two threads running one schedule side by side (schedule/lanes.cc), lane 0 on the caller and
// lane 1 on a pool thread. Inside a lane parallel_for never wakes the pool: in a step one lane
// runs alone it runs every chunk itself, in order; in a step both lanes run (a wide step), lane 0
// runs the kernel and hands the odd chunks of each of its loops to lane 1, which serves them
// until the step ends. Either way the chunks are those of the pool, so the bits are too.
class LanePair {
 public:
  // Runs lane(0) on the calling thread and lane(1) on a pool thread (started if the pool has
  // none, whatever num_threads() says), each with its lane context set; returns when both have
  // returned. A lane must not throw: it stops and calls fail() (the other lane's waits end too).
  template <typename Lane>
  void run(Lane&& lane) {
    run_lanes([](void* ctx, int i) { (*static_cast<Lane*>(ctx))(i); }, static_cast<void*>(&lane));
  }

  // Lane 0 around a wide step's kernel: its loops are shared with lane 1.
  void begin_wide();
  void end_wide();
  // Lane 1 during a wide step: runs the chunks lane 0 hands over until `step_done()`, or until a
  // lane failed.
  template <typename Done>
  void serve(Done&& step_done) {
    SpinWait wait;
    while (!failed()) {
      if (posted_.load(std::memory_order_acquire) != served_) {
        serve_task();
        wait = SpinWait();
        continue;
      }
      if (step_done()) return;
      wait();
    }
  }

  // A lane stopped early (its step threw): every wait of the other lane ends.
  void fail() { failed_.store(true, std::memory_order_release); }
  bool failed() const { return failed_.load(std::memory_order_acquire); }

  // parallel_run inside a lane.
  void run_loop(int64_t n, int64_t grain, detail::RangeFn fn, void* ctx, bool wide);

 private:
  using LaneFn = void (*)(void* ctx, int lane);
  void run_lanes(LaneFn fn, void* ctx);
  void serve_task();

  std::atomic<bool> failed_{false};
  // The loop lane 0 hands over: published by bumping posted_, done when done_ reaches it.
  detail::RangeTask task_;
  std::atomic<uint64_t> posted_{0}, done_{0};
  uint64_t served_ = 0;  // lane 1's: the last loop it ran
};

}  // namespace encore
