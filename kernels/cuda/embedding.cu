// Embedding lookup and its weight gradient on CUDA (the semantics of kernels/cpu/embedding.cc).
//
// An id outside [0, V) cannot throw here without a host sync: its output row is NaN, the
// gradient skips it, and it is reported to the host (report_device_error), which throws the
// CPU's Error when it next waits for the device. The gradient uses no atomics: each element of gw
// belongs to one thread, which adds the gradient elements of its row's ids in id order, so gw has
// the same bits on every run. Threads of a block share a column range and a range of gw's rows
// (blockIdx.y); every thread scans all ids for its rows, staged through shared memory.
#include <cuda/std/limits>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace encore::kernels::cuda {
namespace {

template <typename T, typename I>
__global__ void embedding_kernel(const I* ids, const T* w, T* y, int64_t n, int64_t rows,
                                 int64_t dim, encore::cuda::DeviceErrorSlot errors) {
  const int64_t total = n * dim;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < total;
       k += stride) {
    const int64_t i = k / dim, d = k - i * dim;
    const int64_t v = static_cast<int64_t>(ids[i]);
    const bool in_range = v >= 0 && v < rows;
    y[k] = in_range ? w[v * dim + d] : ::cuda::std::numeric_limits<T>::quiet_NaN();
    if (!in_range && d == 0)
      report_device_error(errors, encore::cuda::DeviceErrorKind::Id, Op::Embedding, v, i, rows);
  }
}

void embedding(const KernelArgs& args) {
  const BufferView &ids = args.in[0], &weight = args.in[1], &y = args.out[0];
  const int64_t rows = weight.shape[0], dim = weight.shape[1], n = ids.numel();
  if (n * dim == 0) return;
  switch_integral(ids.dtype, Op::Embedding, [&]<typename I>(Type<I>) {
    switch_floating(weight.dtype, Op::Embedding, [&]<typename T>(Type<T>) {
      embedding_kernel<T, I><<<blocks_for(n * dim), kThreads, 0, stream()>>>(
          ids.as<I>(), weight.as<T>(), y.as<T>(), n, rows, dim, error_slot());
      ENCORE_CUDA_LAUNCHED(Op::Embedding);
    });
  });
}

constexpr int kGradThreads = 128;     // columns per block
constexpr int kGradRowRanges = 1024;  // blocks along gw's rows (gridDim.y at most)
constexpr int kIdTile = 1024;         // ids staged in shared memory at a time

// gw (zeroed) [v, d] += gy[i, d] for every i with ids[i] == v, in order of i, but the padding
// row. Thread (blockIdx.y, column d) owns rows [r0, r1) of column d; the block stages the ids
// through shared memory, a tile at a time.
template <typename T, typename I>
__global__ void embedding_grad_kernel(const I* ids, const T* gy, T* gw, int64_t n, int64_t rows,
                                      int64_t dim, int64_t pad,
                                      encore::cuda::DeviceErrorSlot errors) {
  __shared__ int64_t tile[kIdTile];
  const int64_t d = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t r0 = rows * blockIdx.y / gridDim.y, r1 = rows * (blockIdx.y + 1) / gridDim.y;
  for (int64_t base = 0; base < n; base += kIdTile) {
    const int64_t count = n - base < kIdTile ? n - base : kIdTile;
    __syncthreads();  // the previous tile is read by every thread
    for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
      const int64_t v = static_cast<int64_t>(ids[base + j]);
      tile[j] = v;
      if ((v < 0 || v >= rows) && blockIdx.x == 0 && blockIdx.y == 0)
        report_device_error(errors, encore::cuda::DeviceErrorKind::Id, Op::EmbeddingGrad, v,
                            base + j, rows);
    }
    __syncthreads();
    if (d >= dim) continue;
    for (int64_t j = 0; j < count; ++j) {
      const int64_t v = tile[j];
      if (v < r0 || v >= r1 || v == pad) continue;
      gw[v * dim + d] += gy[(base + j) * dim + d];
    }
  }
}

void embedding_grad(const KernelArgs& args) {
  const BufferView &ids = args.in[0], &gy = args.in[1], &gw = args.out[0];
  const int64_t pad = args.attr<EmbeddingAttrs>().padding_idx;
  const int64_t rows = gw.shape[0], dim = gw.shape[1], n = ids.numel();
  if (rows * dim == 0) return;
  switch_integral(ids.dtype, Op::EmbeddingGrad, [&]<typename I>(Type<I>) {
    switch_floating(gw.dtype, Op::EmbeddingGrad, [&]<typename T>(Type<T>) {
      ENCORE_CUDA_OK(Op::EmbeddingGrad,
                     cudaMemsetAsync(gw.data, 0, rows * dim * sizeof(T), stream()));
      if (n == 0) return;
      const dim3 grid(static_cast<unsigned>((dim + kGradThreads - 1) / kGradThreads),
                      static_cast<unsigned>(std::min<int64_t>(rows, kGradRowRanges)));
      embedding_grad_kernel<T, I><<<grid, kGradThreads, 0, stream()>>>(
          ids.as<I>(), gy.as<T>(), gw.as<T>(), n, rows, dim, pad, error_slot());
      ENCORE_CUDA_LAUNCHED(Op::EmbeddingGrad);
    });
  });
}

}  // namespace

ENCORE_REGISTER_CUDA(Op::Embedding, &embedding);
ENCORE_REGISTER_CUDA(Op::EmbeddingGrad, &embedding_grad);

}  // namespace encore::kernels::cuda
