// A rank that stalls or dies, and the survivor's Error (run by ctest under mpirun -np 2):
//   fault_check stall   rank 1 sleeps past the 2 s deadline before its all-reduce
//   fault_check kill    rank 1 kills itself (SIGKILL) before its all-reduce; needs
//                       `mpirun --enable-recovery`, or Open MPI ends rank 0 first
// Rank 0 prints "survivor: <the Error> after N s" when its all-reduce throws within the deadline
// plus a margin, which ctest looks for. Both ranks then end without MPI_Finalize (it would wait
// for the peer): the world is broken.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "encore/dist.h"
#include "encore/encore.h"

using namespace encore;

int main(int argc, char** argv) {
  const bool kill = argc > 1 && std::strcmp(argv[1], "kill") == 0;
  dist::init();
  if (dist::world_size() != 2) return 77;
  constexpr double kTimeout = 2;
  dist::set_timeout(kTimeout);
  Tensor t = full({1 << 16}, 1.0);
  dist::all_reduce(t);  // both alive: completes
  if (dist::rank() == 1) {
    if (kill) raise(SIGKILL);
    std::this_thread::sleep_for(std::chrono::duration<double>(kTimeout + 3));
  }
  const auto begin = std::chrono::steady_clock::now();
  try {
    dist::all_reduce(t);
    std::printf("rank %d: the all-reduce completed\n", dist::rank());
  } catch (const Error& e) {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    if (dist::rank() == 0 && s < kTimeout + 2)
      std::printf("survivor: %s after %.1f s\n", e.what(), s);
    else
      std::printf("rank %d: %s after %.1f s\n", dist::rank(), e.what(), s);
  }
  std::fflush(stdout);
  std::_Exit(0);
}
