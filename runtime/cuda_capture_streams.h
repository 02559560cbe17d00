// The runtime's own view of the capture streams of runtime/cuda.h: each thread captures on a set of
// streams of its own per device (capture_stream), which goes back to a pool, whole, when the thread
// ends. The cuBLAS and cuDNN workspaces the captured work uses are those of the set's streams
// (kernels/cuda/stream_libraries.h), so every graph captured on one set shares them, whichever
// thread launches it; LaunchBinding keeps two of those graphs from running at once.
#pragma once

#ifdef ENCORE_HAS_CUDA

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/cuda.h"

namespace encore::cuda {

// Where the graphs captured on one set of capture streams are launched: on the stream the first
// launch came from (the binding), so that the device runs them one after another and never two at
// once in the same workspace. The binding holds while that stream lives: a launch from it is
// checked with three loads and two comparisons (bound_to); one from another stream is queued on
// the bound stream between two event waits, after the work queued so far on the caller's stream
// and before what it gets next (launch_from). A stream the runtime did not make (its end unseen)
// is never bound: the device's default stream is.
class LaunchBinding {
 public:
  // Whether a launch from `stream` goes on `stream` itself.
  bool bound_to(StreamHandle stream) const {
    const Bound* b = bound_.load(std::memory_order_acquire);
    return b != nullptr && b->stream == stream &&
           b->generation.load(std::memory_order_relaxed) == stream_generation();
  }
  // Launches `exec` (a cudaGraphExec_t) from `stream` of `device` on the bound stream, binding
  // one first when there is none or it was destroyed (which waits for the device). Returns
  // cudaGraphLaunch's cudaError_t.
  int launch_from(int device, StreamHandle stream, void* exec);

 private:
  struct Bound {
    StreamHandle stream = nullptr;
    uint64_t serial = 0;                  // the stream's (never 0: a stream the runtime made)
    std::atomic<uint64_t> generation{0};  // stream_generation() when it was last seen alive
  };

  std::atomic<const Bound*> bound_{nullptr};
  std::mutex mu_;
  std::vector<std::unique_ptr<Bound>> bindings_;  // every binding made (bound_ points into it)
};

// The device's default stream (current_stream's when no StreamGuard is in force), made with its
// error slot on first use.
StreamHandle default_stream(int device);

// Runs `fn` and returns true when `stream` is still the stream create_stream gave `serial`
// (destroy_stream waits until `fn` returns); false, without running it, when it is not. `fn`
// must not create or destroy streams or look their serials up.
bool while_stream_lives(StreamHandle stream, uint64_t serial, const std::function<void()>& fn);

// The launch binding of the capture set whose first stream is `origin` on `device`, when it is
// this thread's; null for any other stream (a graph captured there launches where it is told).
LaunchBinding* capture_binding(int device, StreamHandle origin);

// Drops this thread's capture set of `device` for good (its streams are kept alive, for the
// graphs captured on them): the next capture_stream() call makes or takes another. For streams a
// failed capture left in capture mode.
void retire_capture_streams(int device);

}  // namespace encore::cuda

#endif  // ENCORE_HAS_CUDA
