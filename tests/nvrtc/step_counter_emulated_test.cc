// Adam's step counters on CUDA (kernels/cuda/step_counter.cuh), run on the host
// (emulated_kernel.h): every block of a parameter reads the count after the step, whatever the
// number of blocks, and the counter holds that count once the last block has arrived, however large
// the count (below 2^44 before the step); a negative count (or a huge one) is seen (-1) by the
// first block to arrive. The [cuda] optimizer tests check the updates against the CPU on a device.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tests/nvrtc/emulated_kernel.h"

using namespace encore;

namespace {

constexpr const char* kSource = R"cuda(
#include "kernels/cuda/step_counter.cuh"
using namespace encore::kernels::cuda;
// Parameter k has blocks[k] blocks, laid out one parameter after the other; each block's one
// thread counts its parameter's step and writes what it read to seen[block].
extern "C" void count_steps(long long* counters, const unsigned* blocks, int params,
                            long long* seen) {
  unsigned total = 0;
  for (int k = 0; k < params; ++k) total += blocks[k];
  emulate_launch(total, 1, [&] {
    unsigned first = 0;
    int k = 0;
    while (blockIdx.x >= first + blocks[k]) first += blocks[k++];
    seen[blockIdx.x] = count_step(reinterpret_cast<int64_t*>(&counters[k]), blocks[k]);
  });
}
)cuda";

using CountSteps = void (*)(long long*, const unsigned*, int, long long*);

}  // namespace

TEST_CASE("every block of an Adam update reads the step count after the step (emulated)",
          "[nvrtc][emulated]") {
  static const testing::HostObject object({}, kSource);
  const auto run = object.function<CountSteps>("count_steps");
  // Counts from 0, 41 and just below 2^44; one block, a few, and many.
  std::vector<long long> counters = {0, 41, (1LL << 44) - 2, 7};
  const std::vector<unsigned> blocks = {1, 3, 300, 2};
  unsigned total = 0;
  for (unsigned b : blocks) total += b;
  for (int step = 1; step <= 2; ++step) {
    INFO("step " << step);
    const std::vector<long long> before = counters;
    std::vector<long long> seen(total, -1);
    run(counters.data(), blocks.data(), static_cast<int>(blocks.size()), seen.data());
    unsigned at = 0;
    for (size_t k = 0; k < blocks.size(); ++k) {
      INFO("parameter " << k << ", " << blocks[k] << " blocks");
      CHECK(counters[k] == before[k] + 1);
      for (unsigned b = 0; b < blocks[k]; ++b) CHECK(seen[at + b] == before[k] + 1);
      at += blocks[k];
    }
  }
}

TEST_CASE("a negative step count is seen by the first block to arrive (emulated)",
          "[nvrtc][emulated]") {
  static const testing::HostObject object({}, kSource);
  const auto run = object.function<CountSteps>("count_steps");
  for (const long long bad : {-1LL, -(1LL << 50), 1LL << 60})
    for (const unsigned blocks : {1u, 2u, 7u}) {
      INFO("count " << bad << ", " << blocks << " blocks");
      long long counter = bad;
      std::vector<long long> seen(blocks, 0);
      run(&counter, &blocks, 1, seen.data());
      // Whichever block arrives first (the emulator runs the last first).
      CHECK(std::find(seen.begin(), seen.end(), -1) != seen.end());
    }
}
