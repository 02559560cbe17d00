// CUDA collectives through NCCL: one communicator per device, bootstrapped over MPI (rank 0's
// ncclUniqueId broadcast to the others) at the first collective on that device, and a side stream
// per device that the communication runs on, ordered after the device's current stream, so it
// overlaps the compute queued after it. A wait orders the current stream after the side stream:
// the host does not block, so an all-reduce wait has no timeout of its own here (a broadcast,
// which the host waits for, has).
#include <cuda_runtime.h>
#include <nccl.h>

#include <array>

#include "dist/backend.h"
#include "dist/world.h"
#include "runtime/cuda.h"
#include "runtime/error.h"

namespace encore::dist::device {
namespace {

constexpr int kMaxDevices = 16;

struct DeviceComm {
  ncclComm_t comm = nullptr;
  cudaStream_t side = nullptr;
  cudaEvent_t ready = nullptr;  // the current stream reached the collective's start
  cudaEvent_t done = nullptr;   // the side stream finished what was queued on it
};
std::array<DeviceComm, kMaxDevices> g_comms;

void check_cuda(cudaError_t code, std::string_view call) {
  if (code != cudaSuccess) [[unlikely]]
    throw_broken(cat("dist: ", call, " failed on ", rank_name(), ": ", cudaGetErrorString(code)));
}

void check_nccl(ncclResult_t code, std::string_view call) {
  if (code != ncclSuccess) [[unlikely]]
    throw_broken(cat("dist: ", call, " failed on ", rank_name(), ": ", ncclGetErrorString(code)));
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::Float32:
      return ncclFloat32;
    case DType::Float64:
      return ncclFloat64;
    case DType::Int32:
      return ncclInt32;
    case DType::Int64:
      return ncclInt64;
    case DType::Bool:
      break;
  }
  fail("dist::all_reduce: ", dtype, " tensors cannot be reduced (float32, float64, int32, int64)");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
    case ReduceOp::Sum:
      break;
  }
  return ncclSum;
}

cudaStream_t current(int device) {
  return static_cast<cudaStream_t>(cuda::current_stream(device));
}

// The communicator of `device`, made at its first collective (every rank makes its first
// collective on a device at the same point of the program, so the bootstrap matches up).
DeviceComm& comm_of(int device, const Membership& world) {
  ENCORE_CHECK(device >= 0 && device < kMaxDevices, "dist: cuda:", device, " is past the ",
               kMaxDevices, " devices NCCL communicators are kept for");
  DeviceComm& c = g_comms[device];
  if (c.comm != nullptr) return c;
  ncclUniqueId id{};
  if (world.rank == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  static_assert(sizeof(id) % sizeof(int32_t) == 0);
  dist::broadcast(
      BufferView{&id, Shape{static_cast<int64_t>(sizeof(id) / sizeof(int32_t))}, DType::Int32},
      Device::cpu(), 0);
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  check_nccl(ncclCommInitRank(&c.comm, world.size, id, world.rank), "ncclCommInitRank");
  check_cuda(cudaStreamCreateWithFlags(&c.side, cudaStreamNonBlocking), "cudaStreamCreate");
  check_cuda(cudaEventCreateWithFlags(&c.ready, cudaEventDisableTiming), "cudaEventCreate");
  check_cuda(cudaEventCreateWithFlags(&c.done, cudaEventDisableTiming), "cudaEventCreate");
  return c;
}

// Queues the side stream of `c` after the current stream of `device`.
void follow_current(DeviceComm& c, int device) {
  check_cuda(cudaEventRecord(c.ready, current(device)), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(c.side, c.ready, 0), "cudaStreamWaitEvent");
}

}  // namespace

void start_all_reduce(const BufferView& buffer, int device, ReduceOp op, const Membership& world) {
  DeviceComm& c = comm_of(device, world);
  follow_current(c, device);
  check_nccl(ncclAllReduce(buffer.data, buffer.data, static_cast<size_t>(buffer.numel()),
                           nccl_type(buffer.dtype), nccl_op(op), c.comm, c.side),
             "ncclAllReduce");
}

void wait_all_reduce(int device) {
  DeviceComm& c = g_comms[device];
  if (c.comm == nullptr) return;  // nothing was started on this device
  check_cuda(cudaEventRecord(c.done, c.side), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(current(device), c.done, 0), "cudaStreamWaitEvent");
}

void broadcast(const BufferView& buffer, int device, int root, const Membership& world) {
  DeviceComm& c = comm_of(device, world);
  follow_current(c, device);
  check_nccl(ncclBroadcast(buffer.data, buffer.data, buffer.numel() * itemsize(buffer.dtype),
                           ncclUint8, root, c.comm, c.side),
             "ncclBroadcast");
  check_cuda(cudaEventRecord(c.done, c.side), "cudaEventRecord");
  wait_for(
      [&c] {
        const cudaError_t state = cudaEventQuery(c.done);
        if (state != cudaErrorNotReady) check_cuda(state, "cudaEventQuery");
        return state == cudaSuccess;
      },
      [&] {
        return cat("a broadcast of ", buffer.shape, " ", buffer.dtype, " from rank ", root,
                   " on cuda:", device);
      });
  check_cuda(cudaStreamWaitEvent(current(device), c.done, 0), "cudaStreamWaitEvent");
}

void shutdown() {
  for (DeviceComm& c : g_comms) {
    if (c.comm == nullptr) continue;
    // A broken world's peers may be gone: abort instead of a destroy that waits for them.
    (broken() ? ncclCommAbort : ncclCommDestroy)(c.comm);
    cudaEventDestroy(c.ready);
    cudaEventDestroy(c.done);
    cudaStreamDestroy(c.side);
    c = DeviceComm{};
  }
}

}  // namespace encore::dist::device
