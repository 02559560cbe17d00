// parallel_for: splits a large elementwise loop across the CPU's cores (for CPU kernels).
//
//   parallel_for(n, kGrain, [&](int64_t begin, int64_t end) { ... elements [begin, end) ... });
//
// Below `grain` elements per thread the body runs inline on the caller (waking a thread costs
// microseconds). Chunks are disjoint and each element is computed by exactly one thread, so
// an elementwise kernel gives bit-identical results at any thread count. The body must not
// throw. Threads: one per core; ENCORE_NUM_THREADS=1 (or set_num_threads(1)) turns it off.
#pragma once

#include <cstdint>
#include <utility>

namespace encore {

namespace detail {
using RangeFn = void (*)(void* ctx, int64_t begin, int64_t end);
void parallel_run(int64_t n, int64_t grain, RangeFn fn, void* ctx);
}  // namespace detail

template <typename Body>
void parallel_for(int64_t n, int64_t grain, Body&& body) {
  detail::parallel_run(
      n, grain, [](void* ctx, int64_t b, int64_t e) { (*static_cast<Body*>(ctx))(b, e); },
      static_cast<void*>(&body));
}

// Threads parallel_for may use, the caller included (at least 1; default: one per core, or
// ENCORE_NUM_THREADS). OpenBLAS keeps its own threads (OPENBLAS_NUM_THREADS).
int num_threads();
void set_num_threads(int n);

}  // namespace encore
