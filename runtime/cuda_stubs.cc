// The CUDA runtime's entry points in a build without the backend (built without nvcc, or with
// ENCORE_CUDA=OFF): the queries say there is no device, copies between cpu buffers still run,
// waits and frees do nothing, and whatever needs a device raises an Error saying why
// (detail::not_built). The backend itself is cuda.cc and cuda_graph.cc.
#ifndef ENCORE_HAS_CUDA

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/cuda.h"
#include "runtime/cuda_check.h"
#include "runtime/error.h"

namespace encore::cuda {

using detail::not_built;

bool is_built() {
  return false;
}
int device_count() {
  return 0;
}
std::string unavailable_reason() {
  return "this build has no CUDA backend (built without nvcc, or with ENCORE_CUDA=OFF)";
}
void require_device(int index, const char* what) {
  fail(what, ": cuda:", index, " is not available: ", unavailable_reason());
}
int current_device() {
  return 0;
}
void set_device(int) {
  not_built("set_device");
}
DeviceGuard::DeviceGuard(int) : previous_(0) {
  not_built("DeviceGuard");
}
DeviceGuard::~DeviceGuard() = default;
StreamHandle current_stream(int) {
  not_built("current_stream");
}
StreamGuard::StreamGuard(int device, StreamHandle) : device_(device), previous_(nullptr) {
  not_built("StreamGuard");
}
StreamGuard::~StreamGuard() = default;
StreamHandle create_stream(int) {
  not_built("create_stream");
}
StreamHandle capture_stream(int, int) {
  not_built("capture_stream");
}
void hold_capture_streams() {}
void destroy_stream(StreamHandle) {}
uint64_t stream_generation() {
  return 0;
}
uint64_t stream_serial(StreamHandle) {
  return 0;
}
void order_after(int, StreamHandle, StreamHandle, uint64_t) {}
void wait_stream(int, StreamHandle, StreamHandle) {}
void synchronize(int) {}
DeviceErrorSlot device_error_slot(int) {
  not_built("device_error_slot");
}
void check_device_errors(int) {}
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes,
                bool) {
  if (dst_device.type != DeviceType::CPU || src_device.type != DeviceType::CPU) not_built("copy");
  if (bytes > 0) std::memcpy(dst, src, bytes);
}
void* malloc_workspace(size_t) {
  not_built("malloc_workspace");
}
void after_captures(int, std::function<void()> work) {
  work();
}
void outside_captures(const std::function<void()>& work) {
  work();
}
void free_device_memory(int, void*) {}
bool stream_finished(int) {
  not_built("stream_finished");
}
void call_after_stream(int, void (*)(void*), void*) {
  not_built("call_after_stream");
}
Allocator& pinned_allocator() {
  not_built("pin_memory");
}

// ---- Graphs (cuda_graph.cc) ----

bool graphs_enabled() {
  return false;
}
bool set_graphs_enabled(bool) {
  return false;
}
int graph_streams() {
  return 1;
}
int set_graph_streams(int) {
  return 1;
}
Graph::~Graph() = default;
Graph::Graph(Graph&& o) noexcept = default;
Graph& Graph::operator=(Graph&& o) noexcept = default;
void register_capture_preparer(void (*)(StreamHandle)) {}
void Graph::begin_capture(StreamHandle, std::span<const StreamHandle>, int) {
  not_built("graph capture");
}
void Graph::mark(int, StreamHandle) {
  not_built("graph capture");
}
void Graph::after(StreamHandle, int) {
  not_built("graph capture");
}
bool Graph::join() noexcept {
  return false;
}
bool Graph::end_capture(std::span<const GraphCopy>) {
  return false;
}
void Graph::abort_capture() noexcept {}
void Graph::capture_ended() noexcept {}
std::string Graph::streams_left_capturing() {
  return {};
}
void Graph::check_owner(const char*) const {}
int64_t rerouted_graph_launches() {
  return 0;
}
bool Graph::launch(StreamHandle, std::span<const GraphCopy>) {
  not_built("graph launch");
  return false;
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

}  // namespace encore::cuda

#endif  // ENCORE_HAS_CUDA
