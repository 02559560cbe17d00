// The kernels of the embedding lookup and its weight gradient (embedding.cu launches them).
//
// An id outside [0, V) cannot throw here without a host sync: its output row is NaN, the
// gradient skips it, and it is reported to the host (report_device_error), which throws the
// CPU's Error when it next waits for the device. The gradient uses no atomics: each element of gw
// belongs to one thread, which adds the gradient elements of its row's ids in id order, so gw has
// the same bits on every run. Threads of a block share a column range and a range of gw's rows
// (blockIdx.y). Where every block has one row (a vocabulary of at most kGradRowRanges rows, as a
// language model's), the block finds that row's ids together, in order (a ballot per warp), and
// each thread sums their gradient rows in a register and writes its element once; otherwise
// every thread scans all ids for its rows, staged through shared memory, adding into gw.
//
// The host compiles this file too, against stand-ins for the CUDA built-ins
// (tests/nvrtc/embedding_emulated_test.cc runs the kernels on the host).
#pragma once

#include <cuda/std/limits>

#include <cstdint>

#include "kernels/cuda/device_error.cuh"

namespace encore::kernels::cuda {

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

inline constexpr int kGradThreads = 128;     // columns per block
inline constexpr int kGradRowRanges = 1024;  // blocks along gw's rows (gridDim.y at most)
inline constexpr int kIdTile = 1024;         // ids staged in shared memory at a time

// The gradient's grid: blocks of kGradThreads columns by ranges of gw's rows, one row per range
// where gw has at most kGradRowRanges rows (then embedding_grad_row_kernel runs, else
// embedding_grad_kernel).
struct EmbeddingGradGrid {
  unsigned columns, ranges;
  bool one_row;
};
inline EmbeddingGradGrid embedding_grad_grid(int64_t rows, int64_t dim) {
  const bool one_row = rows <= kGradRowRanges;
  return {static_cast<unsigned>((dim + kGradThreads - 1) / kGradThreads),
          static_cast<unsigned>(one_row ? rows : kGradRowRanges), one_row};
}

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

// The one-row form: block row blockIdx.y (== gw's row) and columns blockIdx.x * kGradThreads + t.
// Per tile of ids, the positions holding this row's id (the padding row has none) are gathered
// in order into `hits`, kGradThreads ids at a time: a ballot per warp, the warps' counts before
// this one, and the lanes before this one in its warp. Every element of gw is written, so gw
// needs no zeroing first; the sums run in id order, as the general kernel's, with the same bits.
template <typename T, typename I>
__global__ void embedding_grad_row_kernel(const I* ids, const T* gy, T* gw, int64_t n, int64_t rows,
                                          int64_t dim, int64_t pad,
                                          encore::cuda::DeviceErrorSlot errors) {
  constexpr int kWarps = kGradThreads / 32;
  __shared__ int32_t hits[kIdTile];
  __shared__ int32_t warp_hits[kWarps];
  const int64_t row = blockIdx.y;
  const int64_t d = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  T sum = 0;
  for (int64_t base = 0; base < n; base += kIdTile) {
    const int64_t count = n - base < kIdTile ? n - base : kIdTile;
    int32_t found = 0;  // this tile's hits so far (the same in every thread)
    for (int64_t chunk = 0; chunk < count; chunk += kGradThreads) {
      const int64_t j = chunk + threadIdx.x;
      bool hit = false;
      if (j < count) {
        const int64_t v = static_cast<int64_t>(ids[base + j]);
        hit = v == row && v != pad;
        if ((v < 0 || v >= rows) && blockIdx.x == 0 && blockIdx.y == 0)
          report_device_error(errors, encore::cuda::DeviceErrorKind::Id, Op::EmbeddingGrad, v,
                              base + j, rows);
      }
      const unsigned ballot = __ballot_sync(0xffffffffu, hit);
      if (lane == 0) warp_hits[warp] = __popc(ballot);
      __syncthreads();
      int32_t at = found;
      for (int w = 0; w < warp; ++w) at += warp_hits[w];
      if (hit) hits[at + __popc(ballot & ((1u << lane) - 1u))] = static_cast<int32_t>(j);
      for (int w = 0; w < kWarps; ++w) found += warp_hits[w];
      __syncthreads();  // hits written; warp_hits free for the next chunk
    }
    if (d < dim)
      for (int32_t q = 0; q < found; ++q) sum += gy[(base + hits[q]) * dim + d];
    __syncthreads();  // every thread has read hits before the next tile rewrites it
  }
  if (d < dim) gw[row * dim + d] = sum;
}

}  // namespace encore::kernels::cuda
