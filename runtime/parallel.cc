#include "runtime/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace encore {
namespace {

// Workers sleep on a condition variable between tasks; a task is one range function split
// into one chunk per participating thread. Only one task runs at a time.
class Pool {
 public:
  Pool() {
    int n = static_cast<int>(std::thread::hardware_concurrency());
    if (const char* env = std::getenv("ENCORE_NUM_THREADS")) n = std::atoi(env);
    threads_.store(std::clamp(n, 1, 64));
  }

  int threads() const { return threads_.load(std::memory_order_relaxed); }
  void set_threads(int n) { threads_.store(std::clamp(n, 1, 64)); }

  void run(int64_t n, int64_t grain, detail::RangeFn fn, void* ctx) {
    const int64_t by_size = grain > 0 ? n / grain : n;
    const int parts = static_cast<int>(std::min<int64_t>(threads(), std::max<int64_t>(1, by_size)));
    if (parts <= 1) {
      fn(ctx, 0, n);
      return;
    }
    std::lock_guard<std::mutex> one_task(task_mu_);
    while (workers_ < parts - 1) {
      const int part = ++workers_;
      std::thread([this, part] { work(part); }).detach();
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      fn_ = fn;
      ctx_ = ctx;
      n_ = n;
      parts_ = parts;
      pending_.store(parts - 1, std::memory_order_relaxed);
      ++generation_;
    }
    cv_.notify_all();
    run_part(0);
    while (pending_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
  }

 private:
  void run_part(int part) {
    const int64_t begin = n_ * part / parts_, end = n_ * (part + 1) / parts_;
    if (begin < end) fn_(ctx_, begin, end);
  }

  void work(int part) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return generation_ != seen; });
        seen = generation_;
        if (part >= parts_) continue;  // this task needs fewer threads
      }
      run_part(part);
      pending_.fetch_sub(1, std::memory_order_release);
    }
  }

  std::atomic<int> threads_{1};
  std::mutex task_mu_;  // serialises tasks from several calling threads
  std::mutex mu_;
  std::condition_variable cv_;
  int workers_ = 0;  // threads started so far; worker i runs part i
  uint64_t generation_ = 0;
  detail::RangeFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
  int parts_ = 1;
  std::atomic<int> pending_{0};
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: its threads live until the process exits
  return *p;
}

}  // namespace

void detail::parallel_run(int64_t n, int64_t grain, RangeFn fn, void* ctx) {
  pool().run(n, grain, fn, ctx);
}

int num_threads() {
  return pool().threads();
}
void set_num_threads(int n) {
  pool().set_threads(n);
}

}  // namespace encore
