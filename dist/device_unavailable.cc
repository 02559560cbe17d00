// Device collectives where NCCL is not built: a world of one needs none (world.cc returns before
// calling these); a larger one gets an Error naming what is missing.
#include "dist/backend.h"
#include "dist/world.h"
#include "runtime/error.h"

namespace encore::dist::device {
namespace {

[[noreturn]] void unavailable(std::string_view call, int device) {
  fail("dist::", call, ": cuda:", device, " tensors need NCCL, which this build of encore lacks ",
       "(configure with MPI and the CUDA backend, where the CUDA toolkit ships NCCL)");
}

}  // namespace

void start_all_reduce(const BufferView&, int device, ReduceOp, const Membership&) {
  unavailable("all_reduce", device);
}
void wait_all_reduce(int) {}
void broadcast(const BufferView&, int device, int, const Membership&) {
  unavailable("broadcast", device);
}
void shutdown() {}

}  // namespace encore::dist::device
