// What dist/world.cc asks of its backends: host memory through MPI (or the single-process world),
// CUDA memory through NCCL. Internal to dist/.
#pragma once

#include <cstdint>

#include "runtime/kernel_abi.h"

namespace encore::dist {

struct Membership {
  int rank = 0;
  int size = 1;
};

namespace host {
// Joins the job (idempotent).
Membership join();
// MPI_Finalize, when the peers are known to be alive; otherwise nothing.
void leave(bool peers_alive);
// Non-blocking collectives on host memory: each returns a request slot for test(). Throws Error
// (naming the call) when the backend refuses it or all slots are in flight.
int start_barrier();
int start_broadcast(void* data, int64_t bytes, int root);
int start_all_reduce(void* data, int64_t count, DType dtype, ReduceOp op);
// Whether the request in `slot` is complete (the slot is then free again).
bool test(int slot);
// Tests the oldest in-flight request, if any, so the communication advances between waits.
void progress();
}  // namespace host

namespace device {
// In-place all-reduce of CUDA memory on a side stream ordered after the device's current stream.
void start_all_reduce(const BufferView& buffer, int device, ReduceOp op, const Membership& world);
// Orders the device's current stream after every all-reduce started on it.
void wait_all_reduce(int device);
// Broadcast of CUDA memory from `root` (blocking: the host waits for the stream).
void broadcast(const BufferView& buffer, int device, int root, const Membership& world);
void shutdown();
}  // namespace device

}  // namespace encore::dist
