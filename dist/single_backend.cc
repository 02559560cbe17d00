// The world of one process, where MPI is not built: every collective is complete at once (an
// all-reduce or broadcast over one rank leaves the buffer as it is).
#include <cstdlib>
#include <initializer_list>

#include "dist/backend.h"
#include "runtime/error.h"

namespace encore::dist::host {

// A process that an MPI launcher started as one of several would train alone here: refused.
Membership join() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* size = std::getenv(name);
    ENCORE_CHECK(size == nullptr || std::atoi(size) <= 1,
                 "dist: this process was started as one of ", size, " ranks (", name,
                 "), but encore was built without MPI (ENCORE_MPI=OFF, or "
                 "no MPI found): each rank would train alone. Build with MPI (libopenmpi-dev)");
  }
  return {};
}
void leave(bool) {}
int start_barrier() {
  return 0;
}
int start_broadcast(void*, int64_t, int) {
  return 0;
}
int start_all_reduce(void*, int64_t, DType, ReduceOp) {
  return 0;
}
bool test(int) {
  return true;
}
void progress() {}

}  // namespace encore::dist::host
