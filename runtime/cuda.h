// The CUDA backend's runtime side: devices, streams, copies, pinned host memory and graphs.
// Declared in every build; without CUDA (ENCORE_HAS_CUDA undefined) is_built() is false,
// device_count() is 0 and the rest throws Error saying so.
//
//   if (encore::cuda::is_available()) {
//     Tensor x = host_batch.to(Device::cuda());   // a copy on the device's current stream
//     ...
//     float loss = y.item<float>();               // waits for the stream, then reads
//   }
//
// Every CUDA kernel runs on the current stream of its device (per thread). The default is one
// non-blocking stream per device, created on first use; never the legacy NULL stream, so a
// static replay can capture it into a CUDA graph.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/error.h"

namespace encore::cuda {

// Whether this build has the CUDA backend.
bool is_built();
// Devices usable by this process: 0 without a driver or a GPU (never throws).
int device_count();
inline bool is_available() {
  return device_count() > 0;
}
// Why device_count() is 0 ("this build has no CUDA backend", "no CUDA driver", ...); empty
// when a device is available.
std::string unavailable_reason();
// Throws Error naming `what` unless device `index` exists.
void require_device(int index, const char* what);

// The current device of this thread (cudaSetDevice); the dispatcher switches to an op's device.
int current_device();
void set_device(int index);
// Makes `device` current for the guard's scope; the previous device is current again afterwards,
// also when an Error unwinds the scope.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_;
};

// An opaque cudaStream_t.
using StreamHandle = void*;
// The current stream of `device` on this thread.
StreamHandle current_stream(int device);
// Makes `stream` the current stream of `device` on this thread for the guard's lifetime.
class StreamGuard {
 public:
  StreamGuard(int device, StreamHandle stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  StreamHandle previous_;
};
// A new non-blocking stream on `device` (destroy with destroy_stream).
StreamHandle create_stream(int device);
void destroy_stream(StreamHandle s);
// CUDA may hand a destroyed stream's handle out again, so state cached by stream handle checks
// these: stream_generation() counts destroy_stream calls (nothing cached can be stale while it
// is unchanged), and stream_serial() is a number naming a stream create_stream made for as long
// as it lives (never reused; 0 for a handle it did not make or has destroyed).
uint64_t stream_generation();
uint64_t stream_serial(StreamHandle s);
// Orders the work queued on `waiter` from now on after the work queued so far on `stream` (both
// of `device`), without waiting on the host; `serial` is stream_serial(stream) when it was last
// used: a stream destroyed since, or one create_stream did not make, is waited for by waiting for
// the whole device.
void order_after(int device, StreamHandle waiter, StreamHandle stream, uint64_t serial);
// Orders the work queued on `waiter` from now on after the work queued so far on `stream` (both
// live streams of `device`), through an event, without waiting on the host.
void wait_stream(int device, StreamHandle waiter, StreamHandle stream);
// This thread's streams for capturing graphs on `device` (created on first use): work other
// threads queue on the shared default stream never lands in a capture. Stream 0 is the one a
// capture begins on; the others its branches (Graph::begin_capture), for work the graph runs
// beside. When the thread ends they go, together, to the next thread that captures.
constexpr int kCaptureStreams = 4;
StreamHandle capture_stream(int device, int k = 0);
// Makes this thread's record of its capture streams now. Thread-local state ends in the reverse
// order of its making, so state made after this call (the stream libraries) is left for other
// threads before the thread's capture streams go back to the pool.
void hold_capture_streams();
// Waits for all work queued on the current stream of `device` (when -1, of every device this
// process has made a stream on: the others have no work, and are left without a context).
void synchronize(int device = -1);

// Copies `bytes` between any two devices, in order with the current stream of the CUDA side.
// Waits for the copy unless `non_blocking` is set and the host side is pinned memory (a
// device-to-device copy never waits).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes,
                bool non_blocking = false);

// Calls fn(arg) on a driver thread once the current stream of `device` has reached this point
// (cudaLaunchHostFunc). `fn` must not call CUDA; Tensor::to uses it to keep a pinned source
// alive until its asynchronous copy has read it.
void call_after_stream(int device, void (*fn)(void*), void* arg);
// Runs `work` with `device` current, now or once no graph capture is in progress in any thread (on
// the thread that ends the last): for device-wide work CUDA refuses beside a capture, such as
// cudaFree or destroying a cuBLAS handle, which wait for the device. `work` must not throw.
void after_captures(int device, std::function<void()> work);
// Runs `work` once no graph capture is in progress in any thread, holding new ones off until it
// returns: for device-wide work that must happen now (loading a compiled library). Error on a
// thread inside a capture.
void outside_captures(const std::function<void()>& work);
// cudaFree of `p` on `device`, through after_captures.
void free_device_memory(int device, void* p);
// Whether all work queued so far on the current stream of `device` has finished (without
// waiting; errors it reports are raised at the next wait).
bool stream_finished(int device);

// cudaMalloc of a library's own device memory on the current device (a cuBLAS or cuDNN
// workspace): when the device is out of memory, the device's caching allocator releases its
// cached blocks and the call is tried once more. Null when that fails too. Freed with
// free_device_memory.
void* malloc_workspace(size_t bytes);

// Where kernels report bad input they cannot throw for without waiting for the device (an
// out-of-range label or id, an optimizer's step count it cannot keep): a claim word in device
// memory and a record in mapped host memory, made with the device's default stream and kept for the
// process's life. The first report on a device wins (kernels/cuda/device_error.cuh:
// report_device_error; with several bad inputs, the one a thread reached first, not always the
// lowest index, and in a CUDA graph on several streams maybe another step's than the one eager
// reports); the host reads the record whenever it waits for a stream of the device (synchronize, a
// blocking copy, item()) and throws the Error the cpu kernel throws.
struct DeviceErrorSlot {
  unsigned int* claim = nullptr;  // device memory: 0, or 1 once a kernel has reported
  long long* record = nullptr;    // {kind << 32 | (op + 1), value, index, bound}, device view
};
// The kinds of report, and the messages the host makes of them.
enum class DeviceErrorKind : int {
  Label = 1,   // "label V of sample I is out of range [0, B)"
  Id = 2,      // "argument 'ids' holds V at flat index I, outside [0, B) (weight has B rows)"
  Target = 3,  // cross_entropy's: "argument 'targets': label V at flat index I is out of range"
  // Adam's: "the step count of parameter I is not in [0, B)" (a negative count:
  // kernels/cuda/step_counter.cuh)
  StepCount = 4,
};
DeviceErrorSlot device_error_slot(int device);
// Throws the Error a kernel of `device` reported since the last check (and clears the report).
void check_device_errors(int device);

// Storages freed while streams they were recorded on (Tensor::record_stream) had not yet passed
// the free, whose blocks the allocator has not taken back yet.
int64_t pending_frees();
// Storages freed while a stream they were recorded on was being captured into a CUDA graph that
// the runtime did not begin (a capture of the user's own): no event can be recorded on such a
// stream and the runtime cannot wait for the capture to end, so their blocks are given up, never
// reused (nor returned to the device) while the process lasts. Counted since the process began.
struct LostFrees {
  int64_t blocks = 0, bytes = 0;
};
LostFrees lost_frees();

// Page-locked host memory (cudaHostAlloc), cached like the other allocators. Tensors on it are
// cpu tensors whose copies to a device can be asynchronous (Tensor::pin_memory).
Allocator& pinned_allocator();

// Whether static replay on CUDA captures its schedules as CUDA graphs: on by default,
// ENCORE_CUDA_GRAPHS=0 (read once) or set_graphs_enabled(false) turns it off.
bool graphs_enabled();
// Returns the previous setting.
bool set_graphs_enabled(bool on);
// On how many streams a static schedule's CUDA graphs run its independent steps side by side, for
// signatures traced from now on: 2 by default, ENCORE_CUDA_GRAPH_STREAMS=N (1 to
// kCaptureStreams, read once) or set_graph_streams(n). Returns the previous setting.
int graph_streams();
int set_graph_streams(int n);

// Called on the capturing thread with the stream just before a capture begins on it (the stream's
// device current): a backend makes there what the captured work would otherwise make during the
// capture, where nothing may be allocated (kernels/cuda/stream_libraries.cc: the stream's cuBLAS
// and cuDNN handles and workspaces). Registered at static-initialisation time.
void register_capture_preparer(void (*prepare)(StreamHandle stream));

// Graph launches that were queued on another stream than the caller's (the stream the graph's
// capture streams are bound to: Graph::launch), over the process.
int64_t rerouted_graph_launches();

class LaunchBinding;  // runtime/cuda_capture_streams.h

// A device-to-device copy a graph runs before its captured work (Graph::end_capture); each launch
// may give it another source.
struct GraphCopy {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};

// A captured sequence of work on one stream, or on two side by side, replayed with one launch.
//
//   cuda::Graph g;
//   g.begin_capture(stream);
//   ... enqueue kernels on `stream` ...
//   if (!g.end_capture()) use g.failure();   // capture was invalidated: run the work eagerly
//   g.launch(stream);
//
// With branches, the graph's nodes form chains that the device runs at once, ordered where
// marks say (a mark is the work queued on one stream so far):
//
//   const cuda::StreamHandle branches[] = {branch};
//   g.begin_capture(stream, branches, /*marks=*/1);
//   a();                      // on `stream`
//   g.mark(0, stream);
//   { StreamGuard on(device, branch); b(); }   // b beside a
//   g.after(branch, 0);
//   { StreamGuard on(device, branch); c(); }   // c after a and b
//   g.end_capture();          // the launch ends once all its chains have
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(Graph&& o) noexcept;
  Graph& operator=(Graph&& o) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Starts capturing `stream` in thread-local mode (this thread may not call unsafe APIs such as
  // cudaMalloc meanwhile). Work any thread queues on `stream` lands in the graph, so capture on
  // a stream no other thread uses (capture_stream()). With `branches` (up to kCaptureStreams - 1
  // other such streams of the device: capture_stream(device, 1), ...), work queued on them lands
  // in the graph too, after what `stream` held when the capture began; `marks` is how many marks
  // the capture may set.
  void begin_capture(StreamHandle stream, std::span<const StreamHandle> branches = {},
                     int marks = 0);
  // During a capture with branches: mark(k, s) sets mark k (< marks) to the work queued so far on
  // s (the capture's stream or a branch), and after(s, k) orders the work queued on s from now on
  // after mark k. A mark is set before it is waited for; setting it again moves it.
  void mark(int k, StreamHandle s);
  void after(StreamHandle s, int k);
  // Ends the capture and instantiates the graph (a graph with branches ends once the work of all
  // its streams has), with `first` (copies of at least one byte, on the capture's device) as its
  // first nodes: all of the captured work runs after them. False when the capture failed (the
  // reason is failure()); the streams are usable again either way, unless CUDA left one in
  // capture mode (failure() says so; this thread's next capture then takes new capture streams).
  // On the thread that began the capture (as mark, after and abort_capture).
  bool end_capture(std::span<const GraphCopy> first = {});
  // Ends a capture abandoned because the enqueued work threw (no graph results).
  void abort_capture() noexcept;
  const std::string& failure() const { return failure_; }  // of the last end_capture or launch
  // Whether the captured work forks (two or more roots, or a node with two or more dependents:
  // work of branches beside each other), not counting the first copies.
  bool forks() const { return forks_; }
  // Replays the graph on `stream`. `copies`: end_capture's, in its order and with its
  // destinations and sizes, and this launch's sources (a source that differs from the last
  // launch's is set in the executable graph first; launches already queued keep theirs). False,
  // with nothing launched, when a source cannot be set (memory of another kind than the
  // capture's source: copy it and run the work on the stream instead); failure() says why.
  // The graphs captured on one thread's capture streams share their cuBLAS and cuDNN workspaces,
  // so they run on one stream, the first they were launched from: a launch from another stream is
  // queued there, after the work queued so far on `stream` and before what `stream` gets next.
  [[nodiscard]] bool launch(StreamHandle stream, std::span<const GraphCopy> copies = {});

 private:
  void reset() noexcept;
  // Orders `stream_` after the work queued on the branches (before the capture ends).
  bool join() noexcept;
  // After cudaStreamEndCapture: this thread is out of the capture, and out of the gate.
  void capture_ended() noexcept;
  // After a capture ended: what to add to failure() when CUDA left any of its streams in capture
  // mode (then, when they are this thread's capture streams, the next capture takes others);
  // empty when none. Forgets the branches.
  std::string streams_left_capturing();
  // Error unless the calling thread began the capture.
  void check_owner(const char* what) const;
  StreamHandle stream_ = nullptr;
  std::array<StreamHandle, kCaptureStreams - 1> branches_{};
  int n_branches_ = 0;
  int marks_ = 0;
  int device_ = 0;        // of the capture's events
  LaunchBinding* binding_ = nullptr;    // of exec_'s capture streams, when they are a thread's
  std::thread::id owner_;               // the thread that began the capture
  void* graph_ = nullptr;               // cudaGraph_t: exec_'s, which holds the copy nodes
  void* exec_ = nullptr;                // cudaGraphExec_t
  std::vector<void*> copy_nodes_;       // cudaGraphNode_t, per copy of end_capture
  std::vector<const void*> copy_from_;  // per copy, the source the executable graph has
  bool capturing_ = false;
  bool forks_ = false;
  std::string failure_;
};

// Device-side durations of consecutive pieces of work on one stream (how the profiler times a
// replayed CUDA schedule: a host clock would only see the launches).
//
//   EventTimeline tl;
//   tl.mark(s); step0(); tl.mark(s); step1(); tl.mark(s);
//   std::vector<int64_t> ns = tl.take_intervals_ns();   // {step0, step1}, waiting for the stream
class EventTimeline {
 public:
  EventTimeline() = default;
  ~EventTimeline();
  EventTimeline(const EventTimeline&) = delete;
  EventTimeline& operator=(const EventTimeline&) = delete;
  void mark(StreamHandle stream);
  // Forgets the marks (of a run cut short by an error).
  void clear() { used_ = 0; }
  // Waits for the last mark; the nanoseconds between consecutive marks. Forgets the marks (the
  // events are kept for reuse).
  std::vector<int64_t> take_intervals_ns();

 private:
  std::vector<void*> events_;  // cudaEvent_t, created on demand
  size_t used_ = 0;
};

// Whether the calling thread is capturing a stream into a graph (kernels that would allocate
// or synchronise check this and throw instead).
bool capturing();

// What a kernel throws when a capture asks it for something it makes only outside one (a cuDNN
// or cuBLASLt plan for shapes or an operand alignment it has not run at yet): the capture is
// dropped without counting as failed, the phase runs on the stream, which makes what was
// missing, and the next call with those addresses captures.
class NotReadyForCapture : public Error {
 public:
  using Error::Error;
};

}  // namespace encore::cuda
