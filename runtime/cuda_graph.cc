// CUDA graphs (runtime/cuda.h): whether static replay captures them, the capture state of each
// thread, Graph (capture, instantiate or update, launch) and EventTimeline (how the profiler times
// a replayed schedule on the device).
#include "runtime/cuda.h"

#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "runtime/cuda_check.h"
#include "runtime/env.h"
#include "runtime/error.h"

#ifdef ENCORE_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace encore::cuda {

#ifndef ENCORE_HAS_CUDA

using detail::not_built;

bool graphs_enabled() {
  return false;
}
bool set_graphs_enabled(bool) {
  return false;
}
Graph::~Graph() = default;
Graph::Graph(Graph&& o) noexcept = default;
Graph& Graph::operator=(Graph&& o) noexcept = default;
void register_capture_preparer(void (*)(StreamHandle)) {}
void Graph::begin_capture(StreamHandle) {
  not_built("graph capture");
}
bool Graph::end_capture() {
  return false;
}
void Graph::abort_capture() noexcept {}
void Graph::launch(StreamHandle) const {
  not_built("graph launch");
}
void Graph::reset() noexcept {}
bool capturing() {
  return false;
}
EventTimeline::~EventTimeline() = default;
void EventTimeline::mark(StreamHandle) {
  not_built("EventTimeline");
}
std::vector<int64_t> EventTimeline::take_intervals_ns() {
  return {};
}

#else  // ENCORE_HAS_CUDA

namespace {
std::atomic<int> g_graphs{-1};  // -1: not read from the environment yet
thread_local bool tl_capturing = false;
}  // namespace

bool graphs_enabled() {
  int v = g_graphs.load(std::memory_order_relaxed);
  if (v < 0) {
    v = env::flag("ENCORE_CUDA_GRAPHS", true) ? 1 : 0;
    int expected = -1;
    g_graphs.compare_exchange_strong(expected, v);
    v = g_graphs.load(std::memory_order_relaxed);
  }
  return v == 1;
}

bool set_graphs_enabled(bool on) {
  const bool previous = graphs_enabled();
  g_graphs.store(on ? 1 : 0, std::memory_order_relaxed);
  return previous;
}

bool capturing() {
  return tl_capturing;
}

// ---- Graph ----------------------------------------------------------------------------

Graph::~Graph() {
  reset();
}

Graph::Graph(Graph&& o) noexcept
    : stream_(o.stream_),
      exec_(o.exec_),
      capturing_(o.capturing_),
      failure_(std::move(o.failure_)) {
  o.exec_ = nullptr;
  o.capturing_ = false;
}

Graph& Graph::operator=(Graph&& o) noexcept {
  if (this != &o) {
    reset();
    stream_ = o.stream_;
    exec_ = o.exec_;
    capturing_ = o.capturing_;
    failure_ = std::move(o.failure_);
    o.exec_ = nullptr;
    o.capturing_ = false;
  }
  return *this;
}

void Graph::reset() noexcept {
  abort_capture();
  if (exec_ != nullptr) (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  exec_ = nullptr;
}

namespace {
void (*g_capture_preparer)(StreamHandle) = nullptr;
}  // namespace

void register_capture_preparer(void (*prepare)(StreamHandle stream)) {
  g_capture_preparer = prepare;
}

void Graph::begin_capture(StreamHandle stream) {
  ENCORE_CHECK(!capturing_ && !tl_capturing, "graph capture: this thread is already capturing");
  if (g_capture_preparer != nullptr) g_capture_preparer(stream);
  CHECK_CUDA("graph capture", cudaStreamBeginCapture(static_cast<cudaStream_t>(stream),
                                                     cudaStreamCaptureModeThreadLocal));
  stream_ = stream;
  capturing_ = true;
  tl_capturing = true;
  failure_.clear();
}

void Graph::abort_capture() noexcept {
  if (!capturing_) return;
  cudaGraph_t g = nullptr;
  (void)cudaStreamEndCapture(static_cast<cudaStream_t>(stream_), &g);
  if (g != nullptr) (void)cudaGraphDestroy(g);
  (void)cudaGetLastError();
  capturing_ = false;
  tl_capturing = false;
}

bool Graph::end_capture() {
  ENCORE_CHECK(capturing_, "graph capture: end_capture without begin_capture");
  cudaGraph_t g = nullptr;
  const cudaError_t e = cudaStreamEndCapture(static_cast<cudaStream_t>(stream_), &g);
  capturing_ = false;
  tl_capturing = false;
  if (e != cudaSuccess || g == nullptr) {
    (void)cudaGetLastError();
    if (g != nullptr) (void)cudaGraphDestroy(g);
    failure_ =
        cat("stream capture failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
    return false;
  }
  if (exec_ != nullptr) {
    // Same topology (a recapture with other addresses): update the executable graph in place.
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(static_cast<cudaGraphExec_t>(exec_), g, &info) == cudaSuccess) {
      (void)cudaGraphDestroy(g);
      return true;
    }
    (void)cudaGetLastError();
    (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
    exec_ = nullptr;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t ie = cudaGraphInstantiate(&exec, g, 0);
  (void)cudaGraphDestroy(g);
  if (ie != cudaSuccess) {
    (void)cudaGetLastError();
    failure_ = cat("graph instantiation failed: ", cudaGetErrorName(ie), " (",
                   cudaGetErrorString(ie), ")");
    return false;
  }
  exec_ = exec;
  return true;
}

void Graph::launch(StreamHandle stream) const {
  ENCORE_CHECK(exec_ != nullptr, "graph launch: no graph was captured");
  CHECK_CUDA("graph launch", cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_),
                                             static_cast<cudaStream_t>(stream)));
}

// ---- EventTimeline --------------------------------------------------------------------

EventTimeline::~EventTimeline() {
  for (void* e : events_) (void)cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

void EventTimeline::mark(StreamHandle stream) {
  if (used_ == events_.size()) {
    cudaEvent_t e = nullptr;
    CHECK_CUDA("profiler", cudaEventCreate(&e));
    events_.push_back(e);
  }
  CHECK_CUDA("profiler", cudaEventRecord(static_cast<cudaEvent_t>(events_[used_++]),
                                         static_cast<cudaStream_t>(stream)));
}

std::vector<int64_t> EventTimeline::take_intervals_ns() {
  std::vector<int64_t> out;
  if (used_ == 0) return out;
  CHECK_CUDA("profiler", cudaEventSynchronize(static_cast<cudaEvent_t>(events_[used_ - 1])));
  out.reserve(used_ - 1);
  for (size_t k = 1; k < used_; ++k) {
    float ms = 0;
    CHECK_CUDA("profiler", cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(events_[k - 1]),
                                                static_cast<cudaEvent_t>(events_[k])));
    out.push_back(static_cast<int64_t>(static_cast<double>(ms) * 1e6));
  }
  used_ = 0;
  return out;
}

#endif  // ENCORE_HAS_CUDA

}  // namespace encore::cuda
