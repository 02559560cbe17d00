// The capture streams of each thread, their pool, and where the graphs captured on them launch
// (runtime/cuda_capture_streams.h).
#ifdef ENCORE_HAS_CUDA

#include "runtime/cuda_capture_streams.h"

#include <cuda_runtime.h>

#include <mutex>
#include <vector>

#include "runtime/error.h"

namespace encore::cuda {

namespace {

constexpr int kMaxDevices = 64;

// One thread's streams for capturing on one device, made as asked for, and the binding of the
// graphs captured on them. Never freed: a graph keeps its binding, and the workspaces it names
// are those of these streams.
struct CaptureSet {
  StreamHandle s[kCaptureStreams] = {};
  LaunchBinding binding;
};

// The sets of threads that have ended, per device, for the next thread that captures: the cuBLAS
// and cuDNN handles and workspaces made for a set's streams go with it (a new set per thread
// would leave a dead thread's behind), and a set is passed on whole, so graphs that share a
// workspace share a binding.
std::mutex g_pool_mu;
std::atomic<int64_t> g_rerouted{0};  // rerouted_graph_launches
std::vector<CaptureSet*>* g_pool = new std::vector<CaptureSet*>[kMaxDevices];

struct ThreadSets {
  CaptureSet* of[kMaxDevices] = {};
  ThreadSets() = default;
  ThreadSets(const ThreadSets&) = delete;
  ThreadSets& operator=(const ThreadSets&) = delete;
  ~ThreadSets() {
    const std::lock_guard<std::mutex> lock(g_pool_mu);
    for (int d = 0; d < kMaxDevices; ++d)
      if (of[d] != nullptr) g_pool[d].push_back(of[d]);
  }
};
ThreadSets& thread_sets() {
  thread_local ThreadSets sets;
  return sets;
}

CaptureSet& thread_set(int device) {
  ENCORE_CHECK(device >= 0 && device < kMaxDevices, "capture_stream: CUDA device ", device,
               " is out of the range capture streams are kept for (0 to ", kMaxDevices - 1, ")");
  CaptureSet*& set = thread_sets().of[device];
  if (set != nullptr) [[likely]]
    return *set;
  {
    const std::lock_guard<std::mutex> lock(g_pool_mu);
    if (!g_pool[device].empty()) {
      set = g_pool[device].back();
      g_pool[device].pop_back();
      return *set;
    }
  }
  set = new CaptureSet;
  return *set;
}

}  // namespace

void hold_capture_streams() {
  thread_sets();
}

StreamHandle capture_stream(int device, int k) {
  ENCORE_CHECK(k >= 0 && k < kCaptureStreams, "capture_stream: no capture stream ", k,
               " (a thread has ", kCaptureStreams, " per device)");
  StreamHandle& s = thread_set(device).s[k];
  if (s == nullptr) [[unlikely]]
    s = create_stream(device);
  return s;
}

LaunchBinding* capture_binding(int device, StreamHandle origin) {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  CaptureSet* set = thread_sets().of[device];
  return set != nullptr && set->s[0] == origin ? &set->binding : nullptr;
}

void retire_capture_streams(int device) {
  if (device >= 0 && device < kMaxDevices) thread_sets().of[device] = nullptr;
}

int64_t rerouted_graph_launches() {
  return g_rerouted.load(std::memory_order_relaxed);
}

int LaunchBinding::launch_from(int device, StreamHandle stream, void* exec) {
  const std::lock_guard<std::mutex> lock(mu_);
  const uint64_t generation = stream_generation();  // (before the check: never newer than it)
  // On `to`, from `stream`.
  const auto launch_on = [&](StreamHandle to) {
    if (to == stream)
      return static_cast<int>(
          cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), static_cast<cudaStream_t>(to)));
    wait_stream(device, to, stream);
    const cudaError_t e =
        cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), static_cast<cudaStream_t>(to));
    wait_stream(device, stream, to);
    g_rerouted.fetch_add(1, std::memory_order_relaxed);
    return static_cast<int>(e);
  };
  if (Bound* b = bindings_.empty() ? nullptr : bindings_.back().get(); b != nullptr) {
    int e = 0;
    // The bound stream, while it lives (its owner cannot destroy it meanwhile).
    if (while_stream_lives(b->stream, b->serial, [&] {
          b->generation.store(generation, std::memory_order_relaxed);
          e = launch_on(b->stream);
        }))
      return e;
    // Destroyed: what it queued may still run in the workspaces (this waits for the device).
    order_after(device, stream, b->stream, b->serial);
  }
  // A new binding: `stream`, or the default stream (never destroyed) when the runtime did not make
  // `stream`.
  auto b = std::make_unique<Bound>();
  b->stream = stream;
  b->serial = stream_serial(stream);
  if (b->serial == 0) {
    b->stream = default_stream(device);
    b->serial = stream_serial(b->stream);
  }
  b->generation.store(generation, std::memory_order_relaxed);
  bindings_.push_back(std::move(b));
  bound_.store(bindings_.back().get(), std::memory_order_release);
  return launch_on(bindings_.back()->stream);
}

}  // namespace encore::cuda

#endif  // ENCORE_HAS_CUDA
