// The CUDA backend's runtime (runtime/cuda.h): devices and their caching allocators, streams
// (default and created; the capture streams of graphs are in cuda_capture_streams.cc), waits
// between streams, device-side error slots, copies, workspaces and pinned host memory. A build
// without the backend compiles cuda_stubs.cc instead.
#ifdef ENCORE_HAS_CUDA

#include "runtime/cuda.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "runtime/allocator.h"
#include "runtime/capture_gate.h"
#include "runtime/cuda_capture_streams.h"
#include "runtime/cuda_check.h"
#include "runtime/cuda_stream_frees.h"
#include "runtime/error.h"
#include "runtime/op_traits.h"

namespace encore::cuda {

namespace {

constexpr int kMaxDevices = 64;

struct Probe {
  int count = 0;
  std::string reason;
};

const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      r.reason = cat("no usable CUDA device (cudaGetDeviceCount: ", cudaGetErrorName(e), ", ",
                     cudaGetErrorString(e), ")");
    } else if (n == 0) {
      r.reason = "no CUDA device";
    } else {
      r.count = n < kMaxDevices ? n : kMaxDevices;
    }
    return r;
  }();
  return p;
}

// Per device: its default stream (non-blocking, created on first use).
struct DeviceState {
  std::once_flag once;
  cudaStream_t stream = nullptr;
  DeviceErrorSlot errors;
  // The host's view of errors.record, set once the slot exists.
  std::atomic<volatile long long*> error_record{nullptr};
  std::atomic<bool> used{false};  // a stream of the device exists (it has a context)
};
DeviceState* device_states() {
  static DeviceState* s = new DeviceState[kMaxDevices];
  return s;
}

thread_local int tl_device = -1;
thread_local StreamHandle tl_stream[kMaxDevices] = {};

// The device's error slot (DeviceErrorSlot), made with its default stream.
DeviceErrorSlot make_error_slot(int device) {
  const DeviceGuard on(device);
  DeviceErrorSlot slot;
  void* host = nullptr;
  CHECK_CUDA("device error slot", cudaMalloc(reinterpret_cast<void**>(&slot.claim), 64));
  // Zeroed before any kernel of the device's streams can claim it: a memset runs on the legacy
  // default stream, which does not order the non-blocking streams encore uses.
  CHECK_CUDA("device error slot", cudaMemset(slot.claim, 0, 64));
  CHECK_CUDA("device error slot", cudaDeviceSynchronize());
  CHECK_CUDA("device error slot", cudaHostAlloc(&host, 4 * sizeof(long long), cudaHostAllocMapped));
  std::memset(host, 0, 4 * sizeof(long long));
  CHECK_CUDA("device error slot",
             cudaHostGetDevicePointer(reinterpret_cast<void**>(&slot.record), host, 0));
  device_states()[device].error_record.store(static_cast<volatile long long*>(host),
                                             std::memory_order_release);
  return slot;
}

}  // namespace

StreamHandle default_stream(int device) {
  DeviceState& d = device_states()[device];
  std::call_once(d.once, [&] {
    d.stream = static_cast<cudaStream_t>(create_stream(device));
    d.errors = make_error_slot(device);
  });
  return d.stream;
}

namespace {

// Device memory for the caching allocator of one device.
struct DeviceMemory {
  int index;
};
void* device_alloc(void* ctx, size_t n) {
  const int index = static_cast<DeviceMemory*>(ctx)->index;
  ENCORE_CHECK(!capturing(), "allocate: ", n, " bytes on cuda:", index,
               " requested while capturing a CUDA graph");
  void* p = nullptr;
  cudaError_t e;
  {
    const DeviceGuard on(index);
    e = cudaMalloc(&p, n);
    // Out of memory with frees put off until the captures in progress end: after them.
    if (e == cudaErrorMemoryAllocation && capture_gate().wait_pending()) {
      (void)cudaGetLastError();
      e = cudaMalloc(&p, n);
    }
  }
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return nullptr;
  }
  CHECK_CUDA("allocate", e);
  return p;
}
void device_free(void* ctx, void* p) {
  free_device_memory(static_cast<DeviceMemory*>(ctx)->index, p);
}

Allocator* make_device_allocator(int index) {
  require_device(index, "allocator");
  auto* mem = new DeviceMemory{index};
  return stream_ordered(
             make_caching_allocator({&device_alloc, &device_free, mem, cat("cuda:", index)}))
      .release();
}

[[maybe_unused]] const bool g_registered = [] {
  register_allocator_factory(DeviceType::CUDA, &make_device_allocator);
  return true;
}();

}  // namespace

bool is_built() {
  return true;
}
int device_count() {
  return probe().count;
}
std::string unavailable_reason() {
  return probe().reason;
}
void require_device(int index, const char* what) {
  const Probe& p = probe();
  ENCORE_CHECK(p.count > 0, what, ": cuda:", index, " is not available: ", p.reason);
  ENCORE_CHECK(index >= 0 && index < p.count, what, ": device cuda:", index,
               " does not exist (this machine has ", p.count, " CUDA device",
               p.count == 1 ? "" : "s", ")");
}

int current_device() {
  if (tl_device < 0) {
    int d = 0;
    if (probe().count > 0) CHECK_CUDA("current_device", cudaGetDevice(&d));
    tl_device = d;
  }
  return tl_device;
}

void set_device(int index) {
  if (tl_device == index) [[likely]]
    return;
  require_device(index, "set_device");
  CHECK_CUDA("set_device", cudaSetDevice(index));
  tl_device = index;
}

DeviceGuard::DeviceGuard(int device) : previous_(current_device()) {
  set_device(device);
}
DeviceGuard::~DeviceGuard() {
  if (tl_device == previous_) return;
  (void)cudaSetDevice(previous_);  // it was current a moment ago
  tl_device = previous_;
}

StreamHandle current_stream(int device) {
  StreamHandle s = tl_stream[device];
  return s != nullptr ? s : default_stream(device);
}

StreamGuard::StreamGuard(int device, StreamHandle stream)
    : device_(device), previous_(tl_stream[device]) {
  tl_stream[device] = stream;
}
StreamGuard::~StreamGuard() {
  tl_stream[device_] = previous_;
}

namespace {
// The live streams create_stream made, with their serials.
struct Streams {
  std::mutex mu;
  std::unordered_map<StreamHandle, uint64_t> serial;
  uint64_t next = 1;
};
// Read on every GEMM and convolution: constant-initialized, no guard.
std::atomic<uint64_t> g_stream_generation{0};
Streams& streams() {
  static Streams* s = new Streams;  // never destroyed: streams outlive static destructors
  return *s;
}
}  // namespace

StreamHandle create_stream(int device) {
  require_device(device, "create_stream");
  cudaStream_t s = nullptr;
  {
    const DeviceGuard on(device);
    CHECK_CUDA("create_stream", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  }
  device_states()[device].used.store(true, std::memory_order_release);
  Streams& all = streams();
  const std::lock_guard<std::mutex> lock(all.mu);
  all.serial[s] = all.next++;
  return s;
}

void destroy_stream(StreamHandle s) {
  if (s == nullptr) return;
  Streams& all = streams();
  {
    const std::lock_guard<std::mutex> lock(all.mu);
    all.serial.erase(s);
  }
  (void)cudaStreamDestroy(static_cast<cudaStream_t>(s));
  g_stream_generation.fetch_add(1, std::memory_order_release);
}

uint64_t stream_generation() {
  return g_stream_generation.load(std::memory_order_acquire);
}

uint64_t stream_serial(StreamHandle s) {
  Streams& all = streams();
  const std::lock_guard<std::mutex> lock(all.mu);
  const auto it = all.serial.find(s);
  return it == all.serial.end() ? 0 : it->second;
}

bool while_stream_lives(StreamHandle stream, uint64_t serial, const std::function<void()>& fn) {
  Streams& all = streams();
  const std::lock_guard<std::mutex> lock(all.mu);
  const auto it = all.serial.find(stream);
  if (it == all.serial.end() || it->second != serial) return false;
  fn();
  return true;
}

void synchronize(int device) {
  const int n = device_count();
  for (int d = device < 0 ? 0 : device; d < (device < 0 ? n : device + 1); ++d) {
    // Every device: only those with a stream, which all work goes to. Looking at the others
    // would make a context on each (hundreds of MB of device memory).
    if (device < 0 && !device_states()[d].used.load(std::memory_order_acquire)) continue;
    require_device(d, "synchronize");
    CHECK_CUDA("synchronize", cudaStreamSynchronize(static_cast<cudaStream_t>(current_stream(d))));
  }
  // Every device waited for first, then the first report.
  for (int d = device < 0 ? 0 : device; d < (device < 0 ? n : device + 1); ++d)
    if (device_states()[d].used.load(std::memory_order_acquire)) check_device_errors(d);
}

DeviceErrorSlot device_error_slot(int device) {
  default_stream(device);
  return device_states()[device].errors;
}

void check_device_errors(int device) {
  DeviceState& d = device_states()[device];
  volatile long long* r = d.error_record.load(std::memory_order_acquire);
  if (r == nullptr || r[0] == 0) [[likely]]
    return;
  const long long head = r[0], value = r[1], index = r[2], bound = r[3];
  r[0] = 0;
  // In order after the work that reported: the next report finds the claim free.
  {
    const DeviceGuard on(device);
    (void)cudaMemsetAsync(d.errors.claim, 0, sizeof(unsigned int),
                          static_cast<cudaStream_t>(current_stream(device)));
  }
  const std::string_view op = op_name(static_cast<Op>((head & 0xffffffff) - 1));
  const std::string where =
      cat(" (reported by cuda:", device, " when the host next waited for it)");
  const auto kind = static_cast<DeviceErrorKind>(head >> 32);
  if (kind == DeviceErrorKind::Id)
    fail(op, ": argument 'ids' holds ", value, " at flat index ", index, ", outside [0, ", bound,
         ") (weight has ", bound, " rows)", where);
  if (kind == DeviceErrorKind::Target)
    fail("cross_entropy: argument 'targets': label ", value, " at flat index ", index,
         " is out of range [0, ", bound, ")", where);
  if (kind == DeviceErrorKind::StepCount)
    fail(op, ": the step count of parameter ", index, " of the call is not in [0, ", bound,
         "): its state tensor 't' was set to a count the CUDA update cannot keep", where);
  fail(op, ": label ", value, " of sample ", index, " is out of range [0, ", bound, ")", where);
}

namespace {

// Makes `waiter` wait for the work queued so far on `stream` of `device` (through an event of
// this thread's, one per device).
void wait_for(const char* what, cudaStream_t waiter, int device, cudaStream_t stream) {
  thread_local cudaEvent_t events[kMaxDevices] = {};
  cudaEvent_t& e = events[device];
  {
    const DeviceGuard on(device);
    if (e == nullptr) CHECK_CUDA(what, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CHECK_CUDA(what, cudaEventRecord(e, stream));
  }
  CHECK_CUDA(what, cudaStreamWaitEvent(waiter, e, 0));
}

}  // namespace

void wait_stream(int device, StreamHandle waiter, StreamHandle stream) {
  if (stream == waiter) return;
  wait_for("stream order", static_cast<cudaStream_t>(waiter), device,
           static_cast<cudaStream_t>(stream));
}

void order_after(int device, StreamHandle waiter, StreamHandle stream, uint64_t serial) {
  if (stream == nullptr || stream == waiter) return;
  // Destroyed (its work may still run), or not made here (it may have been destroyed since):
  // the whole device, once no graph capture is in progress (CUDA refuses to synchronise a device
  // a stream of which is being captured).
  if (serial == 0 || stream_serial(stream) != serial) {
    capture_gate().exclusive([&] {
      const DeviceGuard on(device);
      CHECK_CUDA("stream order", cudaDeviceSynchronize());
    });
    return;
  }
  wait_stream(device, waiter, stream);
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes,
                bool non_blocking) {
  const bool dst_cpu = dst_device.type == DeviceType::CPU;
  const bool src_cpu = src_device.type == DeviceType::CPU;
  if (dst_cpu && src_cpu) {
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return;
  }
  // The CUDA side whose stream orders the copy.
  const int device = dst_cpu ? src_device.index : dst_device.index;
  require_device(device, "copy");
  if (bytes == 0) return;
  ENCORE_CHECK(!capturing() || (!dst_cpu && !src_cpu), "copy: a copy of ", bytes, " bytes between ",
               src_device, " and ", dst_device, " cannot be captured in a CUDA graph");
  set_device(device);
  auto stream = static_cast<cudaStream_t>(current_stream(device));
  if (!dst_cpu && !src_cpu && dst_device.index != src_device.index) {
    // On the destination's stream once the source's stream has written the data; and the
    // source's stream waits for the copy before its later work (its caching allocator reuses
    // the source's block in that stream's order).
    auto src_stream = static_cast<cudaStream_t>(current_stream(src_device.index));
    wait_for("copy", stream, src_device.index, src_stream);
    CHECK_CUDA("copy",
               cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, bytes, stream));
    wait_for("copy", src_stream, device, stream);
  } else {
    const cudaMemcpyKind kind = src_cpu   ? cudaMemcpyHostToDevice
                                : dst_cpu ? cudaMemcpyDeviceToHost
                                          : cudaMemcpyDeviceToDevice;
    CHECK_CUDA("copy", cudaMemcpyAsync(dst, src, bytes, kind, stream));
  }
  // A copy that involves the host is finished on return unless asked otherwise.
  if ((dst_cpu || src_cpu) && !non_blocking) {
    CHECK_CUDA("copy", cudaStreamSynchronize(stream));
    check_device_errors(device);
  }
}

void* malloc_workspace(size_t bytes) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaSuccess) return p;
    (void)cudaGetLastError();  // out of memory is not sticky: clear it
    if (e != cudaErrorMemoryAllocation) return nullptr;
    if (attempt > 0) break;
    allocator_for(Device::cuda(current_device())).empty_cache();
    (void)capture_gate().wait_pending();  // frees put off until the captures in progress end
  }
  return nullptr;
}

void after_captures(int device, std::function<void()> work) {
  capture_gate().when_idle([device, work = std::move(work)] {
    int previous = 0;
    (void)cudaGetDevice(&previous);
    if (cudaSetDevice(device) == cudaSuccess) work();
    (void)cudaSetDevice(previous);
  });
}

void outside_captures(const std::function<void()>& work) {
  capture_gate().exclusive(work);
}

void free_device_memory(int device, void* p) {
  if (p == nullptr) return;
  // A failure here (e.g. the driver shutting down at process exit) leaves nothing to recover.
  after_captures(device, [p] { (void)cudaFree(p); });
}

void call_after_stream(int device, void (*fn)(void*), void* arg) {
  require_device(device, "call_after_stream");
  set_device(device);
  CHECK_CUDA("call_after_stream",
             cudaLaunchHostFunc(static_cast<cudaStream_t>(current_stream(device)), fn, arg));
}

bool stream_finished(int device) {
  require_device(device, "stream_finished");
  const cudaError_t e = cudaStreamQuery(static_cast<cudaStream_t>(current_stream(device)));
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  CHECK_CUDA("stream_finished", e);
  return true;
}

Allocator& pinned_allocator() {
  static Allocator* a = [] {
    require_device(0, "pin_memory");
    return make_caching_allocator(
               {[](void*, size_t n) -> void* {
                  ENCORE_CHECK(!capturing(), "pin_memory: allocation while capturing a graph");
                  void* p = nullptr;
                  const cudaError_t e = cudaHostAlloc(&p, n, cudaHostAllocDefault);
                  if (e == cudaErrorMemoryAllocation) {
                    (void)cudaGetLastError();
                    return nullptr;
                  }
                  CHECK_CUDA("pin_memory", e);
                  return p;
                },
                [](void*, void* p) {
                  // Waits for the device: not during a capture.
                  capture_gate().when_idle([p] { (void)cudaFreeHost(p); });
                },
                nullptr, "pinned cpu memory"})
        .release();
  }();
  return *a;
}

}  // namespace encore::cuda

#endif  // ENCORE_HAS_CUDA
