// The process world of a data-parallel job: which process this is, how many there are, and the
// collectives between them. A runtime service (ARCHITECTURE.md: communication has its own
// backend files): MPI for host memory (mpi_backend.cc; single_backend.cc where MPI is not built,
// a world of one process), NCCL for CUDA memory (nccl_backend.cc, bootstrapped over MPI).
//
//   dist::init();                                  // from mpirun's environment; idempotent
//   int r = dist::rank(), n = dist::world_size();
//
// Every wait polls with a deadline (set_timeout, ENCORE_DIST_TIMEOUT): a peer that died or stalls
// makes the wait throw Error instead of hanging, and the world is then broken: every later
// collective throws at once, and finalize() skips MPI_Finalize (which would wait for the dead).
// Collectives are called from one thread at a time (MPI_THREAD_SERIALIZED).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "runtime/kernel_abi.h"

namespace encore::dist {

// Joins the job (MPI_Init_thread) unless already joined; a process not started by mpirun is a
// world of one. Registers finalize() to run at exit.
void init();
bool initialized();
int rank();
int world_size();
// Ends the job's communication (idempotent; also at exit).
void finalize();

// Seconds a wait may take before it throws (default 300, or ENCORE_DIST_TIMEOUT).
void set_timeout(double seconds);
double timeout();

// Whether host requests in flight are tested between kernels (eager dispatch and replayed steps),
// so an all-reduce advances during the compute after its start (default on;
// ENCORE_DIST_PROGRESS=0 turns it off). Off, it advances at later starts and at its wait.
void set_progress_enabled(bool on);
bool progress_enabled();

// Whether an earlier wait timed out or the backend failed (the world cannot be used again).
bool broken();
// Marks the world broken and throws Error(message).
[[noreturn]] void throw_broken(std::string message);
// Polls `done` until it returns true; after timeout() seconds marks the world broken and throws
// Error "dist: rank r of n waited N s for <what()>" (`what` runs only then: a wait allocates
// nothing).
void wait_for(absl::FunctionRef<bool()> done, absl::FunctionRef<std::string()> what);

// The rank's name in messages: "rank 1 of 2".
std::string rank_name();

// Blocking collectives on host or device memory (through wait_for).
void barrier();
void broadcast(const BufferView& buffer, Device device, int root);

// The collective ops' kernels (collective_kernels.cc) call these on the replay path: nothing is
// allocated or looked up. A host all-reduce returns a request slot the wait polls; a device one
// returns -1 (the wait orders the device's stream after the communication).
int64_t start_all_reduce(const BufferView& buffer, Device device, ReduceOp op);
void wait_all_reduce(int64_t slot, const BufferView& buffer, Device device);
// Lets in-flight host requests advance (an MPI test of one of them).
void progress();

}  // namespace encore::dist
