#include "runtime/parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "runtime/env.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace encore {
namespace {

// One spin-loop iteration.
void pause() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Workers spin for a while after a task, then sleep on a condition variable; a task is one range
// function split into one chunk per participating thread. Only one task runs at a time.
class Pool {
 public:
  Pool() {
    const int cores = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 64);
    threads_.store(static_cast<int>(env::integer("ENCORE_NUM_THREADS", 1, 64, cores)));
  }

  int threads() const { return threads_.load(std::memory_order_relaxed); }
  void set_threads(int n) { threads_.store(std::clamp(n, 1, 64)); }

  int parts(int64_t n, int64_t grain) const {
    const int64_t by_size = grain > 0 ? n / grain : n;
    return static_cast<int>(std::min<int64_t>(threads(), std::max<int64_t>(1, by_size)));
  }

  void run(int64_t n, int64_t grain, detail::RangeFn fn, void* ctx) {
    const int p = parts(n, grain);
    if (p <= 1) {
      fn(ctx, 0, n);
      return;
    }
    run_parts(p, n, fn, ctx);
  }

  // Part i of [0, n) on worker i (the caller is worker 0), whatever the thread count.
  void run_parts(int parts, int64_t n, detail::RangeFn fn, void* ctx) {
    std::lock_guard<std::mutex> one_task(task_mu_);
    while (workers_ < parts - 1) {
      const int part = ++workers_;
      std::thread([this, part] { work(part); }).detach();
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      task_ = {fn, ctx, n, parts};
      pending_.store(parts - 1, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    task_.run_chunks(0, parts);
    SpinWait wait;
    while (pending_.load(std::memory_order_acquire) != 0) wait();
  }

 private:
  void work(int part) {
    uint64_t seen = 0;
    for (;;) {
      // Spin a while before sleeping: a training step runs its parallel loops microseconds
      // apart, and waking a sleeping thread takes about 10 us.
      const auto until = std::chrono::steady_clock::now() + kSpin;
      while (generation_.load(std::memory_order_acquire) == seen &&
             std::chrono::steady_clock::now() < until)
        pause();
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return generation_.load(std::memory_order_relaxed) != seen; });
        seen = generation_.load(std::memory_order_relaxed);
        if (part >= task_.parts) continue;  // this task needs fewer threads
      }
      task_.run_chunks(part, task_.parts);
      pending_.fetch_sub(1, std::memory_order_release);
    }
  }

  std::atomic<int> threads_{1};
  std::mutex task_mu_;  // serialises tasks from several calling threads
  std::mutex mu_;
  std::condition_variable cv_;
  int workers_ = 0;  // threads started so far; worker i runs part i
  // Bumped under mu_ for each task; read without it by spinning workers.
  std::atomic<uint64_t> generation_{0};
  static constexpr std::chrono::microseconds kSpin{100};
  detail::RangeTask task_;
  std::atomic<int> pending_{0};
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: its threads live until the process exits
  return *p;
}

// The lane this thread runs, while it runs one.
struct LaneContext {
  LanePair* pair = nullptr;
  bool wide = false;  // lane 0 inside a wide step
};
thread_local LaneContext tls_lane;

}  // namespace

void detail::RangeTask::run_chunks(int first, int step) const {
  for (int i = first; i < parts; i += step) {
    const int64_t begin = n * i / parts, end = n * (i + 1) / parts;
    if (begin < end) fn(ctx, begin, end);
  }
}

void detail::parallel_run(int64_t n, int64_t grain, RangeFn fn, void* ctx) {
  if (tls_lane.pair != nullptr) [[unlikely]] {
    tls_lane.pair->run_loop(n, grain, fn, ctx, tls_lane.wide);
    return;
  }
  pool().run(n, grain, fn, ctx);
}

int parallel_parts(int64_t n, int64_t grain) {
  return pool().parts(n, grain);
}

void SpinWait::operator()() {
  constexpr int kPauses = 2048;
  if (turns_ < kPauses) {
    ++turns_;
    pause();
  } else {
    std::this_thread::yield();
  }
}

void LanePair::run_lanes(LaneFn fn, void* ctx) {
  struct Ctx {
    LanePair* pair;
    LaneFn fn;
    void* ctx;
  } c{this, fn, ctx};
  pool().run_parts(
      2, 2,
      [](void* p, int64_t begin, int64_t) {
        const Ctx& c = *static_cast<const Ctx*>(p);
        tls_lane = LaneContext{c.pair, false};
        c.fn(c.ctx, static_cast<int>(begin));
        tls_lane = LaneContext{};
      },
      &c);
}

void LanePair::begin_wide() {
  tls_lane.wide = true;
}
void LanePair::end_wide() {
  tls_lane.wide = false;
}

void LanePair::run_loop(int64_t n, int64_t grain, detail::RangeFn fn, void* ctx, bool wide) {
  const detail::RangeTask loop{fn, ctx, n, parallel_parts(n, grain)};
  if (!wide || loop.parts <= 1) {
    loop.run_chunks(0, 1);
    return;
  }
  // Lane 0 of a wide step: lane 1 takes the odd chunks.
  task_ = loop;
  const uint64_t posted = posted_.load(std::memory_order_relaxed) + 1;
  posted_.store(posted, std::memory_order_release);
  loop.run_chunks(0, 2);
  SpinWait wait;
  while (done_.load(std::memory_order_acquire) != posted && !failed()) wait();
}

void LanePair::serve_task() {
  served_ = posted_.load(std::memory_order_acquire);
  task_.run_chunks(1, 2);
  done_.store(served_, std::memory_order_release);
}

int num_threads() {
  return pool().threads();
}
void set_num_threads(int n) {
  pool().set_threads(n);
}

}  // namespace encore
