// Helpers shared by the benchmark cases: allocator counters, the BLAS thread count and the
// check that a static case really replayed.
#pragma once

#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cstdint>
#include <memory>
#include <string>

#include "encore/encore.h"
#include "encore/static_graph.h"

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

// Marks the run as failed unless every call of the static function since its creation
// replayed except `traces` traces (a run that fell back to eager would be mislabelled).
inline bool check_replayed(benchmark::State& state, const StaticStats& s, int64_t traces) {
  if (s.traces == traces && s.eager_calls == 0 && s.hits == s.calls - traces) return true;
  const std::string msg = s.name + ": expected " + std::to_string(traces) + " trace(s), the " +
                          "other calls replayed; got calls " + std::to_string(s.calls) +
                          ", traces " + std::to_string(s.traces) + ", hits " +
                          std::to_string(s.hits) + ", eager " + std::to_string(s.eager_calls) +
                          (static_enabled() ? "" : " (static off: ENCORE_STATIC=0?)");
  state.SkipWithError(msg.c_str());
  return false;
}

// One training step: forward, softmax cross entropy, zero_grad, backward, optimizer update.
template <typename Model, typename Opt>
struct TrainStep {
  std::shared_ptr<Model> model;
  Opt opt;
  Tensor operator()(const Tensor& x, const Tensor& labels) {
    Tensor loss = F::softmax_cross_entropy((*model)(x), labels);
    model->zero_grad();
    loss.backward();
    opt.step();
    return loss;
  }
};

// int32 labels 0, 7, 4, 1, ... ((i * 7) % 10).
inline Tensor cyclic_labels(int64_t n) {
  Tensor t = Tensor::empty({n}, DType::Int32);
  for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = static_cast<int32_t>((i * 7) % 10);
  return t;
}

}  // namespace encore::bench
