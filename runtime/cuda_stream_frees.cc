// Frees that wait for streams (cuda_stream_frees.h).
#include "runtime/cuda_stream_frees.h"

#include <atomic>
#include <mutex>
#include <vector>

#include "runtime/cuda.h"
#include "runtime/error.h"

#ifdef ENCORE_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace encore::cuda {

#ifndef ENCORE_HAS_CUDA

void free_after_streams(int, std::span<void* const>, Allocator& allocator, void* p,
                        size_t bytes) noexcept {
  allocator.deallocate(p, bytes);
}
std::unique_ptr<Allocator> stream_ordered(std::unique_ptr<Allocator> inner) {
  return inner;
}
int64_t pending_frees() {
  return 0;
}
LostFrees lost_frees() {
  return {};
}

#else

namespace {

struct PendingFree {
  std::vector<cudaEvent_t> events;  // one per stream the storage was used on
  Allocator* allocator;
  void* p;
  size_t bytes;
};

std::mutex g_mu;
std::vector<PendingFree>* g_pending = new std::vector<PendingFree>;  // never destroyed
std::atomic<int64_t> g_count{0};
std::atomic<int64_t> g_lost_blocks{0}, g_lost_bytes{0};  // lost_frees()

// Returns to their allocators the pending frees whose events have completed (every one, waiting
// for them, when `wait`). An event that reports an error counts as completed: the device has
// failed, and nothing queued after it will run.
void release(bool wait) noexcept {
  std::vector<PendingFree> done;
  {
    const std::lock_guard<std::mutex> lock(g_mu);
    std::vector<PendingFree>& pending = *g_pending;
    for (size_t k = 0; k < pending.size();) {
      bool finished = true;
      for (cudaEvent_t e : pending[k].events)
        if ((wait ? cudaEventSynchronize(e) : cudaEventQuery(e)) == cudaErrorNotReady) {
          finished = false;
          break;
        }
      if (finished) {
        done.push_back(std::move(pending[k]));
        pending[k] = std::move(pending.back());
        pending.pop_back();
      } else {
        ++k;
      }
    }
    g_count.store(static_cast<int64_t>(pending.size()), std::memory_order_relaxed);
  }
  (void)cudaGetLastError();  // a query's cudaErrorNotReady is no error
  for (PendingFree& f : done) {
    for (cudaEvent_t e : f.events) (void)cudaEventDestroy(e);
    f.allocator->deallocate(f.p, f.bytes);
  }
}

class StreamOrdered final : public Allocator {
 public:
  explicit StreamOrdered(std::unique_ptr<Allocator> inner) : inner_(std::move(inner)) {}
  void* allocate(size_t bytes) override {
    if (g_count.load(std::memory_order_relaxed) == 0) [[likely]]
      return inner_->allocate(bytes);
    release(false);
    try {
      return inner_->allocate(bytes);
    } catch (const Error&) {  // out of memory: the blocks still waiting for streams may do
      release(true);
      return inner_->allocate(bytes);
    }
  }
  void deallocate(void* p, size_t bytes) override { inner_->deallocate(p, bytes); }
  AllocatorStats stats() const override { return inner_->stats(); }
  void reset_peak() override { inner_->reset_peak(); }
  void empty_cache() override {
    release(true);
    inner_->empty_cache();
  }

 private:
  std::unique_ptr<Allocator> inner_;
};

// Whether any of `streams` is being captured into a CUDA graph (by any thread).
bool any_capturing(std::span<void* const> streams) noexcept {
  bool capturing = false;
  for (void* s : streams) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    capturing =
        capturing || (cudaStreamIsCapturing(static_cast<cudaStream_t>(s), &status) == cudaSuccess &&
                      status != cudaStreamCaptureStatusNone);
  }
  (void)cudaGetLastError();  // a stream that could not say is not counted as capturing
  return capturing;
}

// Records an event on each stream and keeps the free pending (or waits for the streams and frees
// now, where an event cannot be had). Runs through the capture gate (free_after_streams), so that
// no capture the runtime begins starts between the check of the streams and the records.
void free_now(int device, std::span<void* const> streams, Allocator& allocator, void* p,
              size_t bytes) noexcept {
  // A stream being captured cannot take an event (it would join the capture, and never complete
  // as an event of the stream). The gate puts this off until the runtime's captures end, so only
  // a capture the runtime did not begin is met here: the block is then given up, never reused,
  // rather than reused while the stream may still read it.
  if (any_capturing(streams)) {
    g_lost_blocks.fetch_add(1, std::memory_order_relaxed);
    g_lost_bytes.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
    return;
  }
  PendingFree f{{}, &allocator, p, bytes};
  int previous = 0;
  const bool switched =
      cudaGetDevice(&previous) == cudaSuccess && cudaSetDevice(device) == cudaSuccess;
  bool recorded = switched;
  for (void* s : streams) {
    cudaEvent_t e = nullptr;
    if (recorded && cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess) {
      if (cudaEventRecord(e, static_cast<cudaStream_t>(s)) == cudaSuccess) {
        try {
          f.events.push_back(e);
          continue;
        } catch (...) {  // no memory for the list
        }
      }
      (void)cudaEventDestroy(e);
    }
    recorded = false;
    break;
  }
  if (switched) (void)cudaSetDevice(previous);
  if (recorded) {
    try {
      const std::lock_guard<std::mutex> lock(g_mu);
      g_pending->push_back(std::move(f));
      g_count.store(static_cast<int64_t>(g_pending->size()), std::memory_order_relaxed);
      return;
    } catch (...) {
    }
  }
  // An event could not be had (a stream of another device, a failed device, no memory): wait for
  // the streams themselves instead, then free.
  (void)cudaGetLastError();
  for (cudaEvent_t e : f.events) (void)cudaEventDestroy(e);
  for (void* s : streams) (void)cudaStreamSynchronize(static_cast<cudaStream_t>(s));
  (void)cudaGetLastError();
  allocator.deallocate(p, bytes);
}

}  // namespace

void free_after_streams(int device, std::span<void* const> streams, Allocator& allocator, void* p,
                        size_t bytes) noexcept {
  // Now, with no capture beginning meanwhile, or once the captures in progress end.
  try {
    std::vector<void*> kept(streams.begin(), streams.end());
    after_captures(device, [device, kept = std::move(kept), &allocator, p, bytes] {
      free_now(device, kept, allocator, p, bytes);
    });
    return;
  } catch (...) {  // no memory for the deferral: now, unguarded
  }
  free_now(device, streams, allocator, p, bytes);
}

std::unique_ptr<Allocator> stream_ordered(std::unique_ptr<Allocator> inner) {
  return std::make_unique<StreamOrdered>(std::move(inner));
}

int64_t pending_frees() {
  return g_count.load(std::memory_order_relaxed);
}

LostFrees lost_frees() {
  return {g_lost_blocks.load(std::memory_order_relaxed),
          g_lost_bytes.load(std::memory_order_relaxed)};
}

#endif

}  // namespace encore::cuda
