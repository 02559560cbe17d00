// The entry of the two-process tests: every rank runs the same test cases in the same order (their
// collectives match up). Exits with 77 (skipped) unless started as two ranks by mpirun.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "encore/dist.h"

int main(int argc, char** argv) {
  encore::dist::init();
  if (encore::dist::world_size() != 2) {
    std::fprintf(stderr, "encore_dist_tests: needs two ranks (mpirun -np 2), not %d\n",
                 encore::dist::world_size());
    return 77;
  }
  const int failed = Catch::Session().run(argc, argv);
  encore::dist::finalize();
  return failed == 0 ? 0 : 1;
}
