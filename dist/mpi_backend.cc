// Host collectives through MPI. Requests live in a fixed table of slots (a wait polls its own
// slot; progress() tests the oldest), so starting and finishing one allocates nothing of ours.
// Errors return (MPI_ERRORS_RETURN) instead of aborting the job, so a failure is an Error naming
// the call.
#include <mpi.h>

#include <array>
#include <cstdlib>

#include "dist/backend.h"
#include "dist/world.h"
#include "runtime/comm_progress.h"
#include "runtime/error.h"
#include "runtime/profiler.h"

namespace encore::dist::host {
namespace {

// Requests in flight at once: a step's buckets (25 MiB each) and the odd eager call.
constexpr int kSlots = 64;

std::array<MPI_Request, kSlots> g_requests;
std::array<bool, kSlots> g_busy{};
std::array<uint64_t, kSlots> g_started{};  // start order, for progress()
// While profiling: when each request started (profiler::ticks(), -1: not profiled) and what it
// is, for its span on the trace's communication lane, recorded when a test finds it complete.
std::array<int64_t, kSlots> g_profile_start{};
std::array<std::string_view, kSlots> g_profile_name{};
uint64_t g_starts = 0;
bool g_joined_here = false;  // this process called MPI_Init (so it calls MPI_Finalize)

std::string mpi_message(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return cat("MPI error ", code);
  return std::string(text, static_cast<size_t>(length));
}

void check(int code, std::string_view call) {
  if (code != MPI_SUCCESS) [[unlikely]]
    throw_broken(cat("dist: ", call, " failed on ", rank_name(), ": ", mpi_message(code)));
}

MPI_Datatype mpi_type(DType dtype, std::string_view call) {
  switch (dtype) {
    case DType::Float32:
      return MPI_FLOAT;
    case DType::Float64:
      return MPI_DOUBLE;
    case DType::Int32:
      return MPI_INT32_T;
    case DType::Int64:
      return MPI_INT64_T;
    case DType::Bool:
      break;
  }
  fail("dist::", call, ": ", dtype, " tensors cannot be reduced (float32, float64, int32, int64)");
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max:
      return MPI_MAX;
    case ReduceOp::Min:
      return MPI_MIN;
    case ReduceOp::Sum:
      break;
  }
  return MPI_SUM;
}

int free_slot(std::string_view call) {
  for (int s = 0; s < kSlots; ++s)
    if (!g_busy[s]) {
      g_busy[s] = true;
      g_started[s] = g_starts++;
      g_profile_start[s] = profiler::active() ? profiler::ticks() : -1;
      g_profile_name[s] = call;
      comm_progress::add_in_flight(1);
      return s;
    }
  fail("dist::", call, ": ", kSlots, " requests are in flight on ", rank_name(),
       "; wait for some before starting more");
}

// MPI_Test of the request in `slot`: whether it is complete (now or before).
bool test_request(int slot) {
  MPI_Request& r = g_requests[slot];
  if (r == MPI_REQUEST_NULL) return true;
  int flag = 0;
  check(MPI_Test(&r, &flag, MPI_STATUS_IGNORE), "MPI_Test");
  if (!flag) return false;
  comm_progress::add_in_flight(-1);
  if (g_profile_start[slot] >= 0) [[unlikely]]
    profiler::record_span(g_profile_name[slot], profiler::SpanKind::Communication,
                          g_profile_start[slot], {});
  return true;
}

}  // namespace

Membership join() {
  int already = 0;
  MPI_Initialized(&already);
  if (!already) {
#ifdef OPEN_MPI
    // Open MPI's non-blocking all-reduce (libnbc) picks a binomial reduce-then-broadcast for an
    // in-place call on fewer than four ranks: 7.5 ms for 7 MB between two ranks here, against
    // 2.5 ms for the reduce-scatter then all-gather (Rabenseifner's) it has too. Unless the user
    // chose one (the same variable, or --mca), that one.
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", /*overwrite=*/0);
#endif
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
    g_joined_here = true;
  }
  check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  Membership m;
  check(MPI_Comm_rank(MPI_COMM_WORLD, &m.rank), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &m.size), "MPI_Comm_size");
  return m;
}

void leave(bool peers_alive) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (peers_alive && g_joined_here && !finalized) MPI_Finalize();
}

int start_barrier() {
  const int s = free_slot("barrier");
  check(MPI_Ibarrier(MPI_COMM_WORLD, &g_requests[s]), "MPI_Ibarrier");
  return s;
}

int start_broadcast(void* data, int64_t bytes, int root) {
  ENCORE_CHECK(bytes <= INT32_MAX, "dist::broadcast: ", bytes, " bytes is more than one MPI call ",
               "sends (2^31 - 1)");
  const int s = free_slot("broadcast");
  check(MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD, &g_requests[s]),
        "MPI_Ibcast");
  return s;
}

int start_all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) {
  const MPI_Datatype type = mpi_type(dtype, "all_reduce");
  ENCORE_CHECK(count <= INT32_MAX, "dist::all_reduce: ", count,
               " elements is more than one MPI call reduces (2^31 - 1)");
  const int s = free_slot("all_reduce");
  check(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), type, mpi_op(op),
                       MPI_COMM_WORLD, &g_requests[s]),
        "MPI_Iallreduce");
  return s;
}

bool test(int slot) {
  ENCORE_CHECK(slot >= 0 && slot < kSlots && g_busy[slot], "dist: a wait for request slot ", slot,
               ", which is not in flight");
  const bool done = test_request(slot);
  if (done) g_busy[slot] = false;
  return done;
}

void progress() {
  int oldest = -1;
  // A request completed here stays busy (MPI_REQUEST_NULL): its wait finds it done at once.
  for (int s = 0; s < kSlots; ++s)
    if (g_busy[s] && g_requests[s] != MPI_REQUEST_NULL &&
        (oldest < 0 || g_started[s] < g_started[oldest]))
      oldest = s;
  if (oldest >= 0) test_request(oldest);
}

}  // namespace encore::dist::host
