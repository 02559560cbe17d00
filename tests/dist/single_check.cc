// Run by ctest where MPI is not built, as if an MPI launcher had started it as one of two ranks
// (OMPI_COMM_WORLD_SIZE=2): dist::init must refuse, since the process would train alone. Prints
// "refused: <the Error>", which ctest looks for.
#include <cstdio>

#include "encore/dist.h"
#include "encore/encore.h"

int main() {
  try {
    encore::dist::init();
  } catch (const encore::Error& e) {
    std::printf("refused: %s\n", e.what());
    return 0;
  }
  std::printf("dist::init() accepted a world of %d\n", encore::dist::world_size());
  return 1;
}
