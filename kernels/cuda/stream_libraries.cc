// Per-stream cuBLAS and cuDNN handles and workspaces (stream_libraries.h).
#include "kernels/cuda/stream_libraries.h"

#include <algorithm>
#include <atomic>
#include <iterator>
#include <mutex>
#include <utility>

#include "kernels/cuda/blas.h"
#include "kernels/cuda/common.cuh"

namespace encore::kernels::cuda {
namespace {

constexpr int kMaxDevices = 64;

// Libraries of threads that have ended, which a thread on the same stream takes over.
std::mutex g_orphans_mu;
std::vector<StreamLibraries*>* g_orphans = new std::vector<StreamLibraries*>;  // never destroyed

// A thread's libraries: its last stream's per device, and all of them, left to other threads
// when it ends (a captured graph may name a workspace; a new thread on the stream reuses them).
struct ThreadLibraries {
  uint64_t generation = 0;  // runtime/cuda.h: stream_generation() when `all` was last checked
  StreamLibraries* last[kMaxDevices] = {};
  std::vector<StreamLibraries*> all;

  ThreadLibraries() = default;
  ThreadLibraries(const ThreadLibraries&) = delete;
  ThreadLibraries& operator=(const ThreadLibraries&) = delete;
  ~ThreadLibraries() {
    const std::lock_guard<std::mutex> lock(g_orphans_mu);
    g_orphans->insert(g_orphans->end(), all.begin(), all.end());
  }
};

void free_libraries(StreamLibraries* l);

// An ended thread's libraries of stream `s` (serial `serial`) of `device`, or null. Frees those
// of streams destroyed since (unless this thread is capturing: freeing waits for the device).
StreamLibraries* adopt(int device, cudaStream_t s, uint64_t serial) {
  StreamLibraries* found = nullptr;
  std::vector<StreamLibraries*> dead;
  {
    const std::lock_guard<std::mutex> lock(g_orphans_mu);
    const bool may_free = !encore::cuda::capturing();
    std::vector<StreamLibraries*> kept;
    for (StreamLibraries* l : *g_orphans) {
      if (found == nullptr && l->device == device && l->stream == s && l->serial == serial)
        found = l;
      else if (may_free && l->serial != 0 && encore::cuda::stream_serial(l->stream) != l->serial)
        dead.push_back(l);
      else
        kept.push_back(l);
    }
    *g_orphans = std::move(kept);
  }
  for (StreamLibraries* l : dead) free_libraries(l);
  return found;
}

// Whether any stream has a cuBLAS or cuDNN handle yet, and the largest cuDNN workspace asked
// for: what a stream about to be captured needs made first.
std::atomic<bool> g_blas_used{false}, g_dnn_used{false};
std::atomic<size_t> g_dnn_bytes{0};

// Destroying a handle and freeing a workspace wait for the device, which another thread's capture
// may not: once no capture is in progress (runtime/cuda.h).
void free_libraries(StreamLibraries* l) {
  encore::cuda::after_captures(l->device, [l] {
    if (l->blas != nullptr) (void)cublasDestroy(l->blas);
    if (l->lt != nullptr) (void)cublasLtDestroy(l->lt);
    if (l->dnn != nullptr) (void)cudnnDestroy(l->dnn);
    for (void* p : l->retired) (void)cudaFree(p);
    if (l->blas_workspace != nullptr) (void)cudaFree(l->blas_workspace);
    if (l->dnn_workspace != nullptr) (void)cudaFree(l->dnn_workspace);
    if (l->scratch != nullptr) (void)cudaFree(l->scratch);
    delete l;
  });
}

// After a stream was destroyed somewhere: frees this thread's libraries of streams that no longer
// live (their handle may name a new stream now).
void drop_destroyed(ThreadLibraries& t) {
  std::fill(std::begin(t.last), std::end(t.last), nullptr);
  std::vector<StreamLibraries*> live;
  for (StreamLibraries* l : t.all) {
    if (l->serial == 0 || encore::cuda::stream_serial(l->stream) == l->serial) {
      live.push_back(l);
    } else {
      free_libraries(l);
    }
  }
  t.all = std::move(live);
}

// This thread's libraries of stream `s` of `device`, made (without handles) on first use.
StreamLibraries& libraries_for(Op op, int device, cudaStream_t s) {
  // The capture streams' record first, so that it ends after these libraries: a capture stream
  // goes back to the pool only once its libraries are there for the thread that takes it.
  thread_local const bool streams_first = (encore::cuda::hold_capture_streams(), true);
  (void)streams_first;
  thread_local ThreadLibraries t;
  ENCORE_CHECK(device >= 0 && device < kMaxDevices, op_name(op), ": CUDA device ", device,
               " is out of the range cuBLAS and cuDNN handles are kept for (0 to ", kMaxDevices - 1,
               ")");
  // Freeing waits for the device, which a capture may not: that waits for the next call.
  if (const uint64_t g = encore::cuda::stream_generation();
      g != t.generation && !encore::cuda::capturing()) [[unlikely]] {
    drop_destroyed(t);
    t.generation = g;
  }
  StreamLibraries*& last = t.last[device];
  if (last != nullptr && last->stream == s) [[likely]]
    return *last;
  for (StreamLibraries* l : t.all)
    if (l->device == device && l->stream == s) return *(last = l);
  const uint64_t serial = encore::cuda::stream_serial(s);
  StreamLibraries* l = adopt(device, s, serial);
  if (l == nullptr) {
    l = new StreamLibraries;
    l->device = device;
    l->stream = s;
    l->serial = serial;
  }
  t.all.push_back(l);
  return *(last = l);
}

// `bytes` of device memory for l's `what`, never during graph capture (a capture stream gets its
// own before its capture: prepare_for_capture); Error naming `op` where it cannot be had.
void* allocate_for(StreamLibraries& l, Op op, size_t bytes, const char* what) {
  ENCORE_CHECK(!encore::cuda::capturing(), op_name(op), ": the ", what, " of a stream of CUDA ",
               "device ", l.device, " would be made during CUDA graph capture; run the op on the ",
               "stream eagerly first");
  void* p = encore::cuda::malloc_workspace(bytes);
  ENCORE_CHECK(p != nullptr, op_name(op), ": no device memory for the ", what, " (", bytes,
               " bytes on CUDA device ", l.device, "), even after emptying the caching ",
               "allocator's cache");
  return p;
}

void make_blas(StreamLibraries& l, Op op) {
  void* workspace = allocate_for(l, op, kWorkspaceBytes, "cuBLAS workspace");
  cublasHandle_t h = nullptr;
  if (const cublasStatus_t st = cublasCreate(&h); st != CUBLAS_STATUS_SUCCESS) {
    encore::cuda::free_device_memory(l.device, workspace);
    fail_cublas(op, "cublasCreate(&h)", st);
  }
  // The stream before the workspace: cublasSetStream resets the workspace to cuBLAS's own pool.
  auto configure = [&]() -> std::pair<const char*, cublasStatus_t> {
    if (auto st = cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST); st != CUBLAS_STATUS_SUCCESS)
      return {"cublasSetPointerMode", st};
    if (auto st = cublasSetMathMode(h, CUBLAS_DEFAULT_MATH); st != CUBLAS_STATUS_SUCCESS)
      return {"cublasSetMathMode", st};
    if (auto st = cublasSetStream(h, l.stream); st != CUBLAS_STATUS_SUCCESS)
      return {"cublasSetStream", st};
    return {"cublasSetWorkspace", cublasSetWorkspace(h, workspace, kWorkspaceBytes)};
  };
  if (const auto [call, st] = configure(); st != CUBLAS_STATUS_SUCCESS) {
    encore::cuda::after_captures(l.device, [h] { (void)cublasDestroy(h); });
    encore::cuda::free_device_memory(l.device, workspace);
    fail_cublas(op, call, st);
  }
  cublasLtHandle_t lt = nullptr;
  if (const cublasStatus_t st = cublasLtCreate(&lt); st != CUBLAS_STATUS_SUCCESS) {
    encore::cuda::after_captures(l.device, [h] { (void)cublasDestroy(h); });
    encore::cuda::free_device_memory(l.device, workspace);
    fail_cublas(op, "cublasLtCreate(&lt)", st);
  }
  l.blas_workspace = workspace;
  l.blas = h;
  l.lt = lt;
  g_blas_used.store(true, std::memory_order_relaxed);
}

void make_dnn(StreamLibraries& l, Op op) {
  ENCORE_CHECK(!encore::cuda::capturing(), op_name(op), ": the cuDNN handle of a stream of CUDA ",
               "device ", l.device, " cannot be created while a CUDA graph is captured (run the ",
               "op eagerly first)");
  cudnnHandle_t h = nullptr;
  const cudnnStatus_t st = cudnnCreate(&h);
  ENCORE_CHECK(st == CUDNN_STATUS_SUCCESS, op_name(op),
               ": cuDNN error in cudnnCreate: ", cudnnGetErrorString(st));
  if (const cudnnStatus_t bound = cudnnSetStream(h, l.stream); bound != CUDNN_STATUS_SUCCESS) {
    encore::cuda::after_captures(l.device, [h] { (void)cudnnDestroy(h); });
    fail(op_name(op), ": cuDNN error in cudnnSetStream: ", cudnnGetErrorString(bound));
  }
  l.dnn = h;
  g_dnn_used.store(true, std::memory_order_relaxed);
}

// Before a capture on `stream` (its device current): its scratch; its handles, and a cuDNN
// workspace as large as any asked for, where any stream has used them (a process that never did
// makes none).
void prepare_for_capture(encore::cuda::StreamHandle stream) {
  StreamLibraries& l =
      libraries_for(Op::Matmul, encore::cuda::current_device(), static_cast<cudaStream_t>(stream));
  if (g_blas_used.load(std::memory_order_relaxed) && l.blas == nullptr) make_blas(l, Op::Matmul);
  if (l.scratch == nullptr) l.scratch = allocate_for(l, Op::Matmul, kScratchBytes, "scratch");
  if (g_dnn_used.load(std::memory_order_relaxed)) {
    if (l.dnn == nullptr) make_dnn(l, Op::Conv2d);
    ENCORE_CHECK(reserve_cudnn_workspace(l, g_dnn_bytes.load(std::memory_order_relaxed)),
                 "graph capture: no device memory for the cuDNN workspace of the capture stream");
  }
}

[[maybe_unused]] const bool kRegistered = [] {
  encore::cuda::register_capture_preparer(&prepare_for_capture);
  return true;
}();

}  // namespace

StreamLibraries& stream_libraries(Op op) {
  return libraries_for(op, encore::cuda::current_device(), stream());
}

StreamLibraries& cublas_libraries(Op op) {
  StreamLibraries& l = stream_libraries(op);
  if (l.blas == nullptr) [[unlikely]]
    make_blas(l, op);
  return l;
}

cublasHandle_t cublas_handle(Op op) {
  return cublas_libraries(op).blas;
}

void* stream_scratch(Op op) {
  StreamLibraries& l = stream_libraries(op);
  if (l.scratch == nullptr) [[unlikely]]
    l.scratch = allocate_for(l, op, kScratchBytes, "scratch");
  return l.scratch;
}

bool reserve_cudnn_workspace(StreamLibraries& l, size_t bytes) {
  if (bytes > l.dnn_workspace_bytes) {
    void* p = encore::cuda::malloc_workspace(bytes);  // the allocator's cache emptied if need be
    if (p == nullptr) return false;
    if (l.dnn_workspace != nullptr) l.retired.push_back(l.dnn_workspace);
    l.dnn_workspace = p;
    l.dnn_workspace_bytes = bytes;
  }
  // The largest workspace a stream has: what a capture stream gets before its first capture.
  size_t most = g_dnn_bytes.load(std::memory_order_relaxed);
  while (most < bytes && !g_dnn_bytes.compare_exchange_weak(most, bytes)) {
  }
  return true;
}

StreamLibraries& cudnn_libraries(Op op, size_t bytes) {
  StreamLibraries& l = stream_libraries(op);
  if (l.dnn == nullptr) [[unlikely]]
    make_dnn(l, op);
  if (bytes > l.dnn_workspace_bytes) [[unlikely]] {
    ENCORE_CHECK(!encore::cuda::capturing() && reserve_cudnn_workspace(l, bytes), op_name(op),
                 ": cannot allocate the cuDNN workspace of ", bytes, " bytes on CUDA device ",
                 l.device);
  }
  return l;
}

}  // namespace encore::kernels::cuda
