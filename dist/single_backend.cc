// The world of one process, where MPI is not built: every collective is complete at once (an
// all-reduce or broadcast over one rank leaves the buffer as it is).
#include "dist/backend.h"

namespace encore::dist::host {

Membership join() {
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
