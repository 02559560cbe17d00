// Helpers shared by the benchmark cases: allocator counters and the BLAS thread count.
#pragma once

#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cstdint>

#include "encore/encore.h"

namespace encore::bench {

inline void set_blas_threads_counter(benchmark::State& state) {
  state.counters["blas_threads"] = openblas_get_num_threads();
}

// Records the CPU allocator's activity over the measured loop: construct just before the loop
// (resets the peak), call report() after it.
class AllocatorProbe {
 public:
  AllocatorProbe() : allocator_(allocator_for(Device::cpu())) {
    allocator_.reset_peak();
    start_ = allocator_.stats();
  }

  // peak_bytes: highest bytes in use during the loop (parameters and optimizer state
  // included); system_allocations: calls that reached the system allocator (0 in steady
  // state); allocs_per_iter: allocate() calls per iteration.
  void report(benchmark::State& state) const {
    const AllocatorStats end = allocator_.stats();
    const auto iters = static_cast<double>(state.iterations());
    state.counters["peak_bytes"] =
        benchmark::Counter(static_cast<double>(end.peak_bytes), benchmark::Counter::kDefaults,
                           benchmark::Counter::kIs1024);
    state.counters["system_allocations"] =
        static_cast<double>(end.system_allocations - start_.system_allocations);
    state.counters["allocs_per_iter"] =
        iters > 0 ? static_cast<double>(end.allocation_count - start_.allocation_count) / iters : 0;
  }

 private:
  Allocator& allocator_;
  AllocatorStats start_;
};

}  // namespace encore::bench
