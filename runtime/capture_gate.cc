// The gate between CUDA graph captures and device-wide work (runtime/capture_gate.h).
#include "runtime/capture_gate.h"

#include <new>
#include <utility>

#include "runtime/error.h"

namespace encore::cuda {

namespace {
// The gate this thread's capture is in (a thread captures one graph at a time), and the gate whose
// lock this thread holds while it runs work.
thread_local const CaptureGate* tl_inside = nullptr;
thread_local const CaptureGate* tl_holding = nullptr;
}  // namespace

void CaptureGate::run_locked(const std::function<void()>& work) {
  struct Holding {  // this thread holds the lock while `work` runs, also when it throws
    const CaptureGate* outer;
    ~Holding() { tl_holding = outer; }
  } holding{std::exchange(tl_holding, this)};
  work();
}

void CaptureGate::enter() {
  std::unique_lock<std::mutex> lock(mu_);
  open_.wait(lock, [&] { return waiting_ == 0; });
  ++captures_;
  tl_inside = this;
}

void CaptureGate::leave() {
  const std::lock_guard<std::mutex> lock(mu_);
  if (tl_inside == this) tl_inside = nullptr;
  if (--captures_ > 0) return;
  // Under the lock: no capture begins while the put-off work runs.
  std::vector<std::function<void()>> work = std::exchange(pending_, {});
  for (const std::function<void()>& w : work) {
    try {
      run_locked(w);
    } catch (...) {  // (it must not throw; the rest still runs, and the waiters wake)
    }
  }
  idle_.notify_all();
}

void CaptureGate::exclusive(const std::function<void()>& work) {
  ENCORE_CHECK(tl_inside != this,
               "CUDA: device-wide work (a device synchronisation) was asked for during this "
               "thread's own graph capture, which it would wait for");
  if (tl_holding == this) {  // inside work the gate runs: no capture is in progress
    work();
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  struct Waiting {  // counted until `work` has run (or thrown): captures wait for it
    CaptureGate& gate;
    ~Waiting() {
      if (--gate.waiting_ == 0) gate.open_.notify_all();
    }
  } waiting{(++waiting_, *this)};
  idle_.wait(lock, [&] { return captures_ == 0; });
  run_locked(work);
}

void CaptureGate::when_idle(std::function<void()> work) {
  if (tl_holding == this) {
    work();
    return;
  }
  const std::lock_guard<std::mutex> lock(mu_);
  if (captures_ == 0) {
    run_locked(work);
    return;
  }
  try {
    pending_.push_back(std::move(work));
    ++deferred_;
  } catch (const std::bad_alloc&) {
    // Not run: now it would spoil a capture (a block or handle left unfreed).
  }
}

int CaptureGate::captures() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return captures_;
}

bool CaptureGate::pending() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return !pending_.empty();
}

bool CaptureGate::wait_pending() {
  if (!pending()) return false;
  exclusive([] {});
  return true;
}

int64_t CaptureGate::deferred() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return deferred_;
}

CaptureGate& capture_gate() {
  static CaptureGate* gate = new CaptureGate;  // never destroyed: frees may come at exit
  return *gate;
}

}  // namespace encore::cuda
