// The random kernels (kernels/cuda/random.cuh) run on the host (emulated_kernel.h) on random.cu's
// grid and on one block, against the CPU's uniform_, normal_ and dropout from the same generator
// state: uniform values and dropout masks are the CPU's bits on a device too (random.cuh says
// why), normal values here as well (on the host the kernel's log and cos are glibc's, as the
// CPU's). The (seed, offset) pair read from memory (a CUDA graph's) draws what the attributes
// draw. The [cuda] tests check the device against the CPU.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "encore/encore.h"
#include "tests/nvrtc/emulated_kernel.h"

using namespace encore;

namespace {

constexpr const char* kSource = R"cuda(
#include "kernels/cuda/grid.h"
#include "kernels/cuda/random.cuh"
using namespace encore::kernels::cuda;
// random.cu's launches (kind 0: uniform, 1: normal, 2: dropout of x into y and mask), on its grid
// or on one block; (seed, offset) from `state` when it is not null.
template <typename T>
void draw(int kind, T* p, const T* x, T* mask, long long n, double a, double b,
          unsigned long long seed, unsigned long long offset, const unsigned long long* state,
          bool one_block) {
  const auto* st = reinterpret_cast<const uint64_t*>(state);
  emulate_launch(one_block ? 1u : blocks_for(n), kThreads, [&] {
    if (kind == 0)
      uniform_kernel<T>(p, n, static_cast<T>(a), static_cast<T>(b) - static_cast<T>(a),
                        encore::kernels::uniform_top<T>(a, b), seed,
                        offset, st);
    if (kind == 1)
      normal_kernel<T>(p, n, static_cast<T>(a), static_cast<T>(b), seed, offset, st);
    if (kind == 2)
      dropout_kernel<T>(x, p, mask, n, static_cast<T>(a), static_cast<T>(1.0 / (1.0 - a)), seed,
                        offset, st);
  });
}
#define ENTRY(T, suffix)                                                                     \
  extern "C" void draw_##suffix(int kind, T* p, const T* x, T* mask, long long n, double a,  \
                                double b, unsigned long long seed, unsigned long long offset, \
                                const unsigned long long* state, bool one_block) {           \
    draw<T>(kind, p, x, mask, n, a, b, seed, offset, state, one_block);                      \
  }
ENTRY(float, f32)
ENTRY(double, f64)
)cuda";

template <typename T>
using Draw = void (*)(int, T*, const T*, T*, long long, double, double, unsigned long long,
                      unsigned long long, const unsigned long long*, bool);

template <typename T>
Draw<T> draw_entry() {
  static const testing::HostObject object({}, kSource);
  return object.function<Draw<T>>(testing::typed_name<T>("draw"));
}

constexpr uint64_t kSeed = 1234, kOffset = 40;  // (a generator that has drawn 40 numbers)

// The CPU's op from (kSeed, kOffset) against the kernel's, on its grid, on one block, and with
// (seed, offset) read from memory.
template <typename T>
void check_kind(int kind, int64_t n) {
  INFO((kind == 0   ? "uniform_"
        : kind == 1 ? "normal_"
                    : "dropout")
       << " of " << n << " " << sizeof(T) * 8 << "-bit");
  const DType dtype = sizeof(T) == 4 ? DType::Float32 : DType::Float64;
  const double a = kind == 0 ? -2.0 : kind == 1 ? 0.5 : 0.3, b = kind == 0 ? 3.0 : 2.0;
  const Tensor x = arange(n, dtype);  // dropout's input: nonzero past the first
  Generator& cpu = default_generator(Device::cpu());
  const Generator::Stream before = cpu.state();
  cpu.set_state(kSeed, kOffset);
  Tensor want = zeros({n}, dtype);
  if (kind == 0) uniform_(want, a, b);
  if (kind == 1) normal_(want, a, b);
  if (kind == 2) want = F::dropout(x, a);
  CHECK(cpu.offset() == kOffset + random_count(n));  // the count a kernel's elements cover
  cpu.set_state(before);

  const std::vector<T> xv = x.to_vector<T>();
  const unsigned long long state[2] = {kSeed, kOffset};
  for (const bool one_block : {false, true})
    for (const bool from_memory : {false, true}) {
      INFO((one_block ? "one block" : "random.cu's grid")
           << (from_memory ? ", (seed, offset) from memory" : ""));
      std::vector<T> got(static_cast<size_t>(n)), mask(static_cast<size_t>(n));
      draw_entry<T>()(kind, got.data(), xv.data(), mask.data(), n, a, b, from_memory ? 0 : kSeed,
                      from_memory ? 0 : kOffset, from_memory ? state : nullptr, one_block);
      CHECK(testing::same_bits(got, want.to_vector<T>()));
      if (kind == 2) {
        int64_t kept = 0, wrong = 0;
        const T scale = static_cast<T>(1.0 / (1.0 - a));
        for (int64_t i = 0; i < n; ++i) {
          kept += mask[i] != 0;
          wrong += !(mask[i] == 0 || mask[i] == scale) || got[i] != xv[i] * mask[i];
        }
        CHECK(wrong == 0);
        CHECK((kept > n / 2 && kept < n));  // about 70% kept
      }
    }
}

}  // namespace

TEST_CASE("uniform, normal and dropout draw the CPU's numbers from its state (emulated)",
          "[nvrtc][emulated]") {
  for (const int kind : {0, 1, 2}) {
    check_kind<float>(kind, 1000);  // four blocks of 256 threads, the last partly idle
    check_kind<double>(kind, 333);
  }
}
