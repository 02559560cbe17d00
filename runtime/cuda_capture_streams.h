// The runtime's own view of the capture streams of runtime/cuda.h: each thread captures on a set of
// streams of its own per device (capture_stream), which goes back to a pool, whole, when the thread
// ends. The cuBLAS and cuDNN workspaces the captured work uses are those of the set's streams
// (kernels/cuda/stream_libraries.h), so every graph captured on one set shares them, whichever
// thread launches it; LaunchBinding keeps two of those graphs from running at once.
#pragma once

#ifdef ENCORE_HAS_CUDA

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/cuda.h"

namespace encore::cuda {

// Where the graphs captured on one set of capture streams are launched: on the stream the first
// launch came from (the binding), so that the device runs them one after another and never two at
// once in the same workspace. A launch from that stream costs two loads and a comparison; one
// from another stream is queued on the bound stream between two event waits (after the caller's
// stream, and before its later work), which orders it as if it ran on the caller's stream.
class LaunchBinding {
 public:
  // The stream to launch on from `stream`, when it is `stream` itself.
  bool bound_to(StreamHandle stream) const {
    const Bound* b = bound_.load(std::memory_order_acquire);
    return b != nullptr && b->stream == stream && b->generation == stream_generation();
  }
  // Launches through `launch(s)` (a cudaGraphLaunch on s) from `stream` of `device`, on the bound
  // stream, binding it first when it has none or it was destroyed. Returns launch's result.
  template <typename Launch>
  int launch_from(int device, StreamHandle stream, Launch&& launch) {
    const std::lock_guard<std::mutex> lock(mu_);
    const StreamHandle on = route(device, stream);
    if (on == stream) return launch(stream);
    wait_stream(device, on, stream);
    const int e = launch(on);
    wait_stream(device, stream, on);
    return e;
  }

 private:
  struct Bound {
    StreamHandle stream;
    uint64_t serial;      // the stream's (never 0: a stream the runtime made)
    uint64_t generation;  // stream_generation() when checked
  };
  // With mu_ held: the stream a launch from `stream` goes on, rebinding where needed.
  StreamHandle route(int device, StreamHandle stream);

  std::atomic<const Bound*> bound_{nullptr};
  std::mutex mu_;
  std::vector<std::unique_ptr<Bound>> bindings_;  // every binding made (bound_ points into it)
};

// The device's default stream (current_stream's when no StreamGuard is in force), made with its
// error slot on first use.
StreamHandle default_stream(int device);

// The launch binding of the capture set whose first stream is `origin` on `device`, when it is
// this thread's; null for any other stream (a graph captured there launches where it is told).
LaunchBinding* capture_binding(int device, StreamHandle origin);

// Drops this thread's capture set of `device` for good (its streams are kept alive, for the
// graphs captured on them): the next capture_stream() call makes or takes another. For streams a
// failed capture left in capture mode.
void retire_capture_streams(int device);

}  // namespace encore::cuda

#endif  // ENCORE_HAS_CUDA
