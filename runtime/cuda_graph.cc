// CUDA graphs (runtime/cuda.h): whether static replay captures them, the capture state of each
// thread, Graph (capture, instantiate or update, launch) and EventTimeline (how the profiler times
// a replayed schedule on the device). A build without the backend compiles cuda_stubs.cc instead.
#ifdef ENCORE_HAS_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/capture_gate.h"
#include "runtime/cuda.h"
#include "runtime/cuda_capture_streams.h"
#include "runtime/cuda_check.h"
#include "runtime/env.h"
#include "runtime/error.h"

namespace encore::cuda {

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

namespace {
std::atomic<int> g_graph_streams{0};  // 0: not read from the environment yet
}  // namespace

int graph_streams() {
  int v = g_graph_streams.load(std::memory_order_relaxed);
  if (v == 0) {
    v = static_cast<int>(env::integer("ENCORE_CUDA_GRAPH_STREAMS", 1, kCaptureStreams, 2));
    int expected = 0;
    g_graph_streams.compare_exchange_strong(expected, v);
    v = g_graph_streams.load(std::memory_order_relaxed);
  }
  return v;
}

int set_graph_streams(int n) {
  ENCORE_CHECK(n >= 1 && n <= kCaptureStreams, "set_graph_streams: ", n, " streams (1 to ",
               kCaptureStreams, ")");
  const int previous = graph_streams();
  g_graph_streams.store(n, std::memory_order_relaxed);
  return previous;
}

bool capturing() {
  return tl_capturing;
}

// ---- Graph ----------------------------------------------------------------------------

Graph::~Graph() {
  reset();
}

Graph::Graph(Graph&& o) noexcept {
  *this = std::move(o);
}

Graph& Graph::operator=(Graph&& o) noexcept {
  if (this != &o) {
    reset();
    stream_ = o.stream_;
    branches_ = o.branches_;
    n_branches_ = o.n_branches_;
    marks_ = o.marks_;
    device_ = o.device_;
    binding_ = o.binding_;
    owner_ = o.owner_;
    graph_ = std::exchange(o.graph_, nullptr);
    exec_ = std::exchange(o.exec_, nullptr);
    copy_nodes_ = std::move(o.copy_nodes_);
    copy_from_ = std::move(o.copy_from_);
    capturing_ = std::exchange(o.capturing_, false);
    forks_ = o.forks_;
    failure_ = std::move(o.failure_);
  }
  return *this;
}

void Graph::reset() noexcept {
  abort_capture();
  if (exec_ != nullptr) (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_ != nullptr) (void)cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  exec_ = nullptr;
  graph_ = nullptr;
  binding_ = nullptr;
  forks_ = false;
  copy_nodes_.clear();
  copy_from_.clear();
}

namespace {
void (*g_capture_preparer)(StreamHandle) = nullptr;
}  // namespace

void register_capture_preparer(void (*prepare)(StreamHandle stream)) {
  g_capture_preparer = prepare;
}

namespace {

// This thread's events for captures with branches, per device: the fork, the join, then one per
// mark. Made before a capture begins (never during one) and kept for the thread's life. (The
// fork is waited for by every branch, and the join recorded on one branch after another: a
// wait takes the event as recorded when the wait is queued.)
constexpr int kMaxDevices = 64;
constexpr int kFork = 0, kJoin = 1, kFirstMark = 2;
struct CaptureEvents {
  std::vector<cudaEvent_t> of[kMaxDevices];
  CaptureEvents() = default;
  CaptureEvents(const CaptureEvents&) = delete;
  CaptureEvents& operator=(const CaptureEvents&) = delete;
  ~CaptureEvents() {
    for (const std::vector<cudaEvent_t>& events : of)
      for (cudaEvent_t e : events) (void)cudaEventDestroy(e);
  }
};
std::vector<cudaEvent_t>& capture_events(int device) {
  thread_local CaptureEvents events;
  ENCORE_CHECK(device >= 0 && device < kMaxDevices, "graph capture: CUDA device ", device,
               " is out of the range capture events are kept for (0 to ", kMaxDevices - 1, ")");
  return events.of[device];
}

}  // namespace

void Graph::begin_capture(StreamHandle stream, std::span<const StreamHandle> branches,
                          int marks) {
  ENCORE_CHECK(!capturing_ && !tl_capturing, "graph capture: this thread is already capturing");
  ENCORE_CHECK(branches.size() < kCaptureStreams, "graph capture: ", branches.size(),
               " branches (at most ", kCaptureStreams - 1, ")");
  ENCORE_CHECK(marks >= 0 && (marks == 0 || !branches.empty()),
               "graph capture: marks order a capture's streams (", marks,
               " marks asked for without a branch)");
  if (g_capture_preparer != nullptr) {
    g_capture_preparer(stream);
    for (StreamHandle b : branches) g_capture_preparer(b);
  }
  const int device = current_device();
  // The device's error slot, which its kernels name, is made with a device synchronisation:
  // before any capture on it.
  (void)device_error_slot(device);
  std::vector<cudaEvent_t>& events = capture_events(device);
  const size_t needed = branches.empty() ? 0 : static_cast<size_t>(kFirstMark + marks);
  while (events.size() < needed) {
    cudaEvent_t e = nullptr;
    CHECK_CUDA("graph capture", cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    events.push_back(e);
  }
  // In the gate from before the capture begins until after it ends (capture_gate.h).
  capture_gate().enter();
  if (const cudaError_t e = cudaStreamBeginCapture(static_cast<cudaStream_t>(stream),
                                                   cudaStreamCaptureModeThreadLocal);
      e != cudaSuccess) {
    capture_gate().leave();
    detail::fail_call("graph capture", "cudaStreamBeginCapture", e);
  }
  stream_ = stream;
  owner_ = std::this_thread::get_id();
  n_branches_ = static_cast<int>(branches.size());
  std::copy(branches.begin(), branches.end(), branches_.begin());
  marks_ = marks;
  device_ = device;
  capturing_ = true;
  tl_capturing = true;
  failure_.clear();
  if (branches.empty()) return;
  // The fork: the branches join the capture after what `stream` holds now.
  const char* call = "cudaEventRecord (the fork)";
  cudaError_t e = cudaEventRecord(events[kFork], static_cast<cudaStream_t>(stream));
  int joined = 0;  // the branches in the capture so far
  while (e == cudaSuccess && joined < n_branches_) {
    call = "cudaStreamWaitEvent (a branch)";
    e = cudaStreamWaitEvent(static_cast<cudaStream_t>(branches[joined]), events[kFork], 0);
    if (e == cudaSuccess) ++joined;
  }
  if (e != cudaSuccess) {
    n_branches_ = joined;  // (the join of abort_capture: those only)
    abort_capture();
    detail::fail_call("graph capture", call, e);
  }
}

void Graph::check_owner(const char* what) const {
  ENCORE_CHECK(owner_ == std::this_thread::get_id(), "graph capture: ", what,
               " on another thread than the one that began the capture (CUDA ends a capture only "
               "on its own thread)");
}

void Graph::mark(int k, StreamHandle s) {
  ENCORE_CHECK(capturing_ && k >= 0 && k < marks_, "graph capture: mark ", k,
               " is not one of this capture's ", marks_);
  check_owner("mark");
  CHECK_CUDA("graph capture", cudaEventRecord(capture_events(device_)[kFirstMark + k],
                                              static_cast<cudaStream_t>(s)));
}

void Graph::after(StreamHandle s, int k) {
  ENCORE_CHECK(capturing_ && k >= 0 && k < marks_, "graph capture: mark ", k,
               " is not one of this capture's ", marks_);
  check_owner("after");
  CHECK_CUDA("graph capture", cudaStreamWaitEvent(static_cast<cudaStream_t>(s),
                                                  capture_events(device_)[kFirstMark + k], 0));
}

bool Graph::join() noexcept {
  bool joined = true;
  for (int k = 0; k < n_branches_; ++k) {
    const cudaEvent_t e = capture_events(device_)[kJoin];
    joined = cudaEventRecord(e, static_cast<cudaStream_t>(branches_[k])) == cudaSuccess &&
             cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), e, 0) == cudaSuccess &&
             joined;
  }
  return joined;
}

void Graph::abort_capture() noexcept {
  if (!capturing_) return;
  if (owner_ != std::this_thread::get_id()) {
    // The capture cannot be ended here, and its thread would stay inside it for good.
    std::fputs("encore: a CUDA graph capture was abandoned on another thread than its own\n",
               stderr);
    std::abort();
  }
  (void)join();  // an unjoined branch would stay in the capture
  cudaGraph_t g = nullptr;
  (void)cudaStreamEndCapture(static_cast<cudaStream_t>(stream_), &g);
  if (g != nullptr) (void)cudaGraphDestroy(g);
  (void)cudaGetLastError();
  capture_ended();
  try {
    (void)streams_left_capturing();
  } catch (...) {  // (the message's allocation)
  }
}

void Graph::capture_ended() noexcept {
  capturing_ = false;
  tl_capturing = false;
  capture_gate().leave();
}

std::string Graph::streams_left_capturing() {
  bool left = false;
  for (int k = -1; k < n_branches_; ++k) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const auto s = static_cast<cudaStream_t>(k < 0 ? stream_ : branches_[k]);
    left = cudaStreamIsCapturing(s, &status) != cudaSuccess ||
           status != cudaStreamCaptureStatusNone || left;
  }
  (void)cudaGetLastError();
  n_branches_ = 0;
  if (!left) return {};
  // This thread's capture streams: the next capture takes new ones (these are kept, unused, for
  // the graphs captured on them before).
  if (capture_binding(device_, stream_) == nullptr)
    return "; CUDA left its streams in capture mode";
  retire_capture_streams(device_);
  return "; CUDA left its streams in capture mode, and this thread's next capture takes new ones";
}

namespace {

// ENCORE_CUDA_GRAPH_COPY_CHAIN=1 puts a graph's first copies one after another, the last before
// every root, rather than each before every root (roots of their own, which the launch may start
// on streams of their own): on an H200, MlpSmall's second copy (its labels, 0.7 us) started 5.4 us
// after its first ended, and its first kernel 2.9 us after that. To compare the two. Read once.
bool chained_first_copies() {
  static const bool on = env::flag("ENCORE_CUDA_GRAPH_COPY_CHAIN", false);
  return on;
}

// Puts `copies` before every root of `g` (the captured work), in a chain where
// chained_first_copies(): their nodes, in order, in `nodes`.
// Their kind, here and when launch() sets a source, is inferred from the addresses
// (cudaMemcpyDefault): a static call's arguments are device memory, and a source of another kind
// is then copied as what it is, never read as device memory (a kind that does not match the
// pointers is undefined behaviour).
cudaError_t add_first_copies(cudaGraph_t g, std::span<const GraphCopy> copies,
                             std::vector<void*>& nodes) {
  size_t n_roots = 0;
  cudaError_t e = cudaGraphGetRootNodes(g, nullptr, &n_roots);
  std::vector<cudaGraphNode_t> roots(n_roots);
  if (e == cudaSuccess && n_roots > 0) e = cudaGraphGetRootNodes(g, roots.data(), &n_roots);
  std::vector<cudaGraphNode_t> from, to;
  const bool chain = chained_first_copies();
  cudaGraphNode_t last = nullptr;
  for (size_t k = 0; e == cudaSuccess && k < copies.size(); ++k) {
    cudaGraphNode_t node = nullptr;
    const bool after_last = chain && last != nullptr;
    e = cudaGraphAddMemcpyNode1D(&node, g, after_last ? &last : nullptr, after_last ? 1 : 0,
                                 copies[k].dst, copies[k].src, copies[k].bytes, cudaMemcpyDefault);
    nodes.push_back(node);
    last = node;
    if (chain && k + 1 < copies.size()) continue;  // (the last of the chain precedes the roots)
    for (size_t r = 0; r < n_roots; ++r) {
      from.push_back(node);
      to.push_back(roots[r]);
    }
  }
  if (e == cudaSuccess && !from.empty())
    e = cudaGraphAddDependencies(g, from.data(), to.data(), nullptr, from.size());
  return e;
}

// Whether g has two or more roots, or a node with two or more dependents (false where CUDA will
// not say).
bool has_fork(cudaGraph_t g) {
  size_t roots = 0, n = 0;
  if (cudaGraphGetRootNodes(g, nullptr, &roots) == cudaSuccess && roots >= 2) return true;
  if (cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  // With the edges' data: a graph with a programmatic edge (a programmatic dependent launch)
  // answers a query without it with cudaErrorLossyQuery.
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  if (n == 0 || cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  from.resize(n);
  std::sort(from.begin(), from.end());
  return std::adjacent_find(from.begin(), from.end()) != from.end();
}

}  // namespace

bool Graph::end_capture(std::span<const GraphCopy> first) {
  ENCORE_CHECK(capturing_, "graph capture: end_capture without begin_capture");
  check_owner("end_capture");
  for (size_t k = 0; k < first.size(); ++k)
    ENCORE_CHECK(first[k].bytes > 0, "graph capture: first copy ", k, " has no bytes");
  (void)join();  // (a failed join fails the capture: a branch is not joined)
  cudaGraph_t g = nullptr;
  const cudaError_t e = cudaStreamEndCapture(static_cast<cudaStream_t>(stream_), &g);
  capture_ended();
  reset();  // (a graph captured before, if any)
  const auto fail = [&](const char* what, cudaError_t err) {
    (void)cudaGetLastError();
    if (g != nullptr && graph_ == nullptr) (void)cudaGraphDestroy(g);
    reset();
    failure_ = cat(what, cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
    return false;
  };
  if (e != cudaSuccess || g == nullptr) {
    fail("stream capture failed: ", e);
    failure_ += streams_left_capturing();
    return false;
  }
  n_branches_ = 0;
  // Owned from here (reset() destroys it), and kept: the copy nodes are set per launch through
  // the graph they were made in.
  graph_ = g;
  forks_ = has_fork(g);
  if (const cudaError_t ce = add_first_copies(g, first, copy_nodes_); ce != cudaSuccess)
    return fail("adding the graph's first copies failed: ", ce);
  for (const GraphCopy& c : first) copy_from_.push_back(c.src);
  cudaGraphExec_t exec = nullptr;
  if (const cudaError_t ie = cudaGraphInstantiate(&exec, g, 0); ie != cudaSuccess)
    return fail("graph instantiation failed: ", ie);
  exec_ = exec;
  binding_ = capture_binding(device_, stream_);
  return true;
}

bool Graph::launch(StreamHandle stream, std::span<const GraphCopy> copies) {
  ENCORE_CHECK(exec_ != nullptr, "graph launch: no graph was captured");
  ENCORE_CHECK(copies.size() == copy_nodes_.size(), "graph launch: ", copies.size(),
               " copies given for a graph captured with ", copy_nodes_.size());
  const auto exec = static_cast<cudaGraphExec_t>(exec_);
  for (size_t k = 0; k < copies.size(); ++k) {
    if (copies[k].src == copy_from_[k]) continue;
    if (const cudaError_t e = cudaGraphExecMemcpyNodeSetParams1D(
            exec, static_cast<cudaGraphNode_t>(copy_nodes_[k]), copies[k].dst, copies[k].src,
            copies[k].bytes, cudaMemcpyDefault);
        e != cudaSuccess) {
      (void)cudaGetLastError();
      failure_ = cat("setting copy ", k, "'s source failed: ", cudaGetErrorName(e), " (",
                     cudaGetErrorString(e), ")");
      return false;
    }
    copy_from_[k] = copies[k].src;
  }
  // (Launched inside a capture, it is a node of the captured graph, on the capture's stream.)
  if (binding_ == nullptr || tl_capturing || binding_->bound_to(stream)) [[likely]] {
    CHECK_CUDA("graph launch", cudaGraphLaunch(exec, static_cast<cudaStream_t>(stream)));
    return true;
  }
  CHECK_CUDA("graph launch",
             static_cast<cudaError_t>(binding_->launch_from(device_, stream, exec_)));
  return true;
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

}  // namespace encore::cuda

#endif  // ENCORE_HAS_CUDA
