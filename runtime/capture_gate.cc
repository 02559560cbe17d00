// The gate between CUDA graph captures and device-wide work (runtime/capture_gate.h).
#include "runtime/capture_gate.h"

#include <utility>

#include "runtime/error.h"

namespace encore::cuda {

namespace {
// The gate this thread's capture is in (a thread captures one graph at a time).
thread_local const CaptureGate* tl_inside = nullptr;
}  // namespace

void CaptureGate::enter() {
  const std::lock_guard<std::mutex> lock(mu_);
  ++captures_;
  tl_inside = this;
}

void CaptureGate::leave() {
  const std::lock_guard<std::mutex> lock(mu_);
  if (tl_inside == this) tl_inside = nullptr;
  if (--captures_ > 0) return;
  // Under the lock: no capture begins while the put-off work runs.
  std::vector<std::function<void()>> work = std::exchange(pending_, {});
  for (const std::function<void()>& w : work) w();
  idle_.notify_all();
}

void CaptureGate::exclusive(const std::function<void()>& work) {
  ENCORE_CHECK(tl_inside != this,
               "CUDA: device-wide work (a device synchronisation) was asked for during this "
               "thread's own graph capture, which it would wait for");
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [&] { return captures_ == 0; });
  work();
}

void CaptureGate::when_idle(std::function<void()> work) {
  const std::lock_guard<std::mutex> lock(mu_);
  if (captures_ == 0) {
    work();
    return;
  }
  pending_.push_back(std::move(work));
  ++deferred_;
}

int CaptureGate::captures() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return captures_;
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
