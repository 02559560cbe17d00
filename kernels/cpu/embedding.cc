// Embedding lookup and its weight gradient. ids [...] (int32 or int64), weight [V, D]:
// y[i, :] = weight[ids[i], :]. The gradient is a scatter-add with no atomics: each row of gw
// belongs to one thread, which adds the gradient rows of its ids in id order, so gw has the
// same bits at any thread count.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/kernel.h"
#include "runtime/parallel.h"
#include "runtime/value_checks.h"

namespace encore::kernels::cpu {
namespace {

// Rows of y copied per chunk of a parallel loop (enough bytes to pay for waking a thread).
int64_t grain_rows(int64_t row_bytes) {
  return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, row_bytes));
}

void embedding_kernel(const KernelArgs& args) {
  const BufferView &ids = args.in[0], &weight = args.in[1], &y = args.out[0];
  const int64_t rows = weight.shape[0], dim = weight.shape[1], n = ids.numel();
  switch_integral(ids.dtype, Op::Embedding, [&]<typename I>(Type<I>) {
    const I* pi = ids.as<I>();
    check_ids(pi, n, rows, Op::Embedding);  // before anything is written
    switch_floating(weight.dtype, Op::Embedding, [&]<typename T>(Type<T>) {
      const T* w = weight.as<T>();
      T* py = y.as<T>();
      const size_t row_bytes = static_cast<size_t>(dim) * sizeof(T);
      parallel_for(n, grain_rows(static_cast<int64_t>(row_bytes)), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i)
          if (row_bytes != 0)
            std::memcpy(py + i * dim, w + static_cast<int64_t>(pi[i]) * dim, row_bytes);
      });
    });
  });
}

// ids, gy [..., D] -> gw [V, D]: gw[v] = sum over i with ids[i] == v, in order of i, of gy[i];
// the padding row (EmbeddingAttrs::padding_idx >= 0) stays 0. Threads own disjoint ranges of
// rows, and each scans all ids for its own.
void embedding_grad_kernel(const KernelArgs& args) {
  const BufferView &ids = args.in[0], &gy = args.in[1], &gw = args.out[0];
  const int64_t pad = args.attr<EmbeddingAttrs>().padding_idx;
  const int64_t rows = gw.shape[0], dim = gw.shape[1], n = ids.numel();
  switch_integral(ids.dtype, Op::EmbeddingGrad, [&]<typename I>(Type<I>) {
    const I* pi = ids.as<I>();
    check_ids(pi, n, rows, Op::EmbeddingGrad);
    switch_floating(gw.dtype, Op::EmbeddingGrad, [&]<typename T>(Type<T>) {
      const T* g = gy.as<T>();
      T* pw = gw.as<T>();
      std::fill(pw, pw + rows * dim, T(0));
      // Every chunk scans all n ids: split only when the additions outweigh that.
      const int64_t grain = n * dim < (int64_t{1} << 15) ? std::max<int64_t>(rows, 1) : 1;
      parallel_for(rows, grain, [&](int64_t b, int64_t e) {
        for (int64_t i = 0; i < n; ++i) {
          const int64_t v = static_cast<int64_t>(pi[i]);
          if (v < b || v >= e || v == pad) continue;
          T* dst = pw + v * dim;
          const T* src = g + i * dim;
          for (int64_t d = 0; d < dim; ++d) dst[d] += src[d];
        }
      });
    });
  });
}

[[maybe_unused]] const bool kRegistered = [] {
  register_kernel(Op::Embedding, DeviceType::CPU, &embedding_kernel);
  register_kernel(Op::EmbeddingGrad, DeviceType::CPU, &embedding_grad_kernel);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cpu
