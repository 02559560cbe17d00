// The process's CUDA graph captures in progress, and the device-wide work that may not run beside
// one (runtime/cuda.cc, runtime/cuda_graph.cc). CUDA refuses to synchronise a device while a
// stream of it is being captured, whichever thread captures: such a call fails in its own thread
// and may invalidate the capture. So a capture enters the gate when it begins and leaves when it
// ends, and the work that would wait for the device either waits for the gate or is put off:
//
//   gate.enter();  ... capture ...  gate.leave();      // the capturing thread
//   gate.exclusive([&] { cudaDeviceSynchronize(); });  // waits for every capture to end first
//   gate.when_idle([p] { cudaFree(p); });              // now, or when the last capture ends
//
// No capture begins while exclusive work runs or waits (enter waits for it). Kept apart from CUDA
// so that its waiting and ordering are tested on every machine.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

namespace encore::cuda {

class CaptureGate {
 public:
  // A capture begins and ends (on one thread). enter() waits while exclusive work runs or waits
  // to run; leave() runs the work put off meanwhile when it ends the last capture in progress.
  void enter();
  void leave();

  // Runs `work` once no capture is in progress, with none beginning until it returns (captures
  // that would begin wait for it, so a stream of them cannot keep it waiting). Error when the
  // calling thread is inside a capture itself (it would wait for itself).
  void exclusive(const std::function<void()>& work);

  // Runs `work` now when no capture is in progress, else when the last one ends (on the thread
  // that ends it). `work` must not throw; what it throws is dropped.
  void when_idle(std::function<void()> work);

  // Work runs with the gate's lock held, so that no capture begins meanwhile; work that uses the
  // gate again (exclusive, when_idle) runs at once, in place.

  int captures() const;
  // Whether put-off work waits for the captures in progress to end.
  bool pending() const;
  // When put-off work waits, waits for it to run (exclusive: the captures in progress end); whether
  // there was any. For a caller that is out of memory while frees are put off.
  bool wait_pending();
  // How many pieces of work when_idle has put off so far.
  int64_t deferred() const;

 private:
  // Runs `work` with mu_ held.
  void run_locked(const std::function<void()>& work);

  mutable std::mutex mu_;
  std::condition_variable idle_;  // the last capture in progress ended
  std::condition_variable open_;  // no exclusive work waits any more
  int captures_ = 0;
  int waiting_ = 0;  // exclusive work waiting for the captures in progress to end
  std::vector<std::function<void()>> pending_;
  int64_t deferred_ = 0;
};

// The process's gate.
CaptureGate& capture_gate();

}  // namespace encore::cuda
