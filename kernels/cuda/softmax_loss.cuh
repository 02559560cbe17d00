// The kernels of the softmax family and the losses on CUDA (softmax_loss.cu launches them).
//
// Softmax sees a tensor as [outer, n, inner] with n the softmax axis: each (outer, inner) pair is
// a lane of n elements at stride inner. A lane goes to one thread (inner > 1 with many lanes:
// adjacent threads read adjacent elements), a warp, or a block, whose threads join their partial
// max and sums with a fixed shuffle/shared-memory tree.
//
// The cross-entropy loss runs a warp per sample over as many blocks as its rows fill (up to
// kCrossEntropyMaxBlocks), each block's sums stored in its stream's scratch and joined by the
// block that finishes last, in the blocks' order whichever that is; the other scalar losses run
// in one block of 1024 threads, a warp per sample. All join their parts in a fixed order; sums
// over samples are in double as on the CPU. The cross-entropy gradient recounts the
// non-ignored labels in each of its blocks rather than keeping the count in a scratch buffer.
// A label outside [0, C) (other than the ignore label) cannot throw here without a host sync:
// it makes the loss (or accuracy) NaN and its gradient row NaN, and is reported to the host
// (report_device_error), which throws the CPU's Error when it next waits for the device.
//
// The host compiles this file too, against stand-ins for the CUDA built-ins
// (tests/nvrtc/softmax_loss_emulated_test.cc runs the kernels on the host).
#pragma once

#include <cuda/std/limits>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_error.cuh"
#include "kernels/cuda/element_ops.cuh"
#include "kernels/cuda/grid.h"
#include "kernels/cuda/reduce_util.cuh"
#include "kernels/strided_loop.h"
#include "runtime/fused.h"

namespace encore::kernels::cuda {

inline constexpr unsigned kFullMask = 0xffffffffu;

template <typename T>
__device__ __forceinline__ T nan_of() {
  return ::cuda::std::numeric_limits<T>::quiet_NaN();
}

// ---- Softmax, log-softmax and their gradients ---------------------------------------------

// y = softmax(x) or log_softmax(x) along each lane.
template <bool kLog, int kGroup, typename T>
__global__ void __launch_bounds__(kBlockThreads<kGroup>)
    softmax_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t lanes, int64_t n,
                   int64_t inner) {
  __shared__ T sh[32];
  for_each_group_item<kGroup>(lanes, [&](int64_t lane, int g) {
    const int64_t base = lane / inner * n * inner + lane % inner;
    const T* px = x + base;
    T* py = y + base;
    T m = LaneMaxOp::identity<T>();
    for (int64_t i = g; i < n; i += kGroup) m = LaneMaxOp::combine(m, px[i * inner]);
    m = group_reduce<LaneMaxOp, kGroup>(m, sh);
    T sum = 0;
    for (int64_t i = g; i < n; i += kGroup) sum += rowop::softmax_term(px[i * inner], m);
    sum = group_reduce<SumOp, kGroup>(sum, sh);
    if constexpr (kLog) {
      const T log_sum = dev_log(sum);
      for (int64_t i = g; i < n; i += kGroup)
        py[i * inner] = rowop::log_softmax_value(px[i * inner], m, log_sum);
    } else {
      const T inv = T(1) / sum;
      for (int64_t i = g; i < n; i += kGroup)
        py[i * inner] = rowop::softmax_value(px[i * inner], m, inv);
    }
  });
}

// softmax: gx = y * (gy - sum(gy * y)); log_softmax: gx = gy - exp(y) * sum(gy).
template <bool kLog, int kGroup, typename T>
__global__ void __launch_bounds__(kBlockThreads<kGroup>)
    softmax_grad_kernel(const T* __restrict__ y, const T* __restrict__ gy, T* __restrict__ gx,
                        int64_t lanes, int64_t n, int64_t inner) {
  __shared__ T sh[32];
  for_each_group_item<kGroup>(lanes, [&](int64_t lane, int g) {
    const int64_t base = lane / inner * n * inner + lane % inner;
    const T* py = y + base;
    const T* pg = gy + base;
    T* px = gx + base;
    T dot = 0;
    for (int64_t i = g; i < n; i += kGroup)
      dot += rowop::softmax_grad_term<kLog>(py[i * inner], pg[i * inner]);
    dot = group_reduce<SumOp, kGroup>(dot, sh);
    for (int64_t i = g; i < n; i += kGroup)
      px[i * inner] = rowop::softmax_grad_value<kLog>(py[i * inner], pg[i * inner], dot);
  });
}

// Calls launch(std::integral_constant<int, kGroup>{}) with the threads per lane for `l`
// (outer * inner lanes of n elements).
template <typename Launch>
void with_group(const AxisSplit& l, Launch&& launch) {
  const int64_t lanes = l.outer * l.inner;
  if (l.inner > 1 && (lanes >= 2048 || l.n <= 32)) {
    launch(std::integral_constant<int, 1>{});
  } else if (lanes < 64 && l.n >= 8192) {
    launch(std::integral_constant<int, 1024>{});
  } else if (l.n > kMaxCudaRow) {  // a warp per row up to it: fused runs too
    launch(std::integral_constant<int, kThreads>{});
  } else {
    launch(std::integral_constant<int, 32>{});
  }
}

// ---- Losses and accuracy --------------------------------------------------------------------

inline constexpr int kLossThreads = 1024;
inline constexpr int kLossWarps = kLossThreads / 32;

// For K contiguous rows of n >= 1 elements at once, their loads in flight together: of each live
// row, the largest element m[k] and sum(exp(row - m[k])) sum[k], to every lane of the warp. `live`
// is the same in every lane, and every lane reaches the shuffles, live or not.
template <int K, typename T>
__device__ __forceinline__ void warp_rows_exp_sums(const T* const (&row)[K], const bool (&live)[K],
                                                   int64_t n, int lane, T (&m)[K], T (&sum)[K]) {
#pragma unroll
  for (int k = 0; k < K; ++k) m[k] = LaneMaxOp::identity<T>();
  for (int64_t j = lane; j < n; j += 32) {
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (live[k]) m[k] = LaneMaxOp::combine(m[k], row[k][j]);
  }
#pragma unroll
  for (int k = 0; k < K; ++k) {
    m[k] = warp_reduce<LaneMaxOp>(m[k]);
    sum[k] = 0;
  }
  for (int64_t j = lane; j < n; j += 32) {
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (live[k]) sum[k] += dev_exp(row[k][j] - m[k]);
  }
#pragma unroll
  for (int k = 0; k < K; ++k) sum[k] = warp_reduce<SumOp>(sum[k]);
}

inline constexpr int64_t kNoIndex = ::cuda::std::numeric_limits<int64_t>::max();

// Whether element i of value v comes before element arg of value best as the first maximum of a
// row: a NaN before any number, then the larger, then (equal, or both NaN) the lower index.
template <typename T>
__device__ __forceinline__ bool before(T v, int64_t i, T best, int64_t arg) {
  if (arg == kNoIndex) return true;
  const bool v_nan = v != v, best_nan = best != best;
  if (v_nan != best_nan) return v_nan;
  if (v_nan || v == best) return i < arg;
  return v > best;
}

// The index the CPU's scan picks: the first maximum of the row, or its first NaN (as
// torch.argmax). n >= 1; to every lane.
template <typename T>
__device__ __forceinline__ int64_t warp_first_argmax(const T* row, int64_t n, int lane) {
  T best = T(0);
  int64_t arg = kNoIndex;
  for (int64_t j = lane; j < n; j += 32) {
    const T v = row[j];
    if (before(v, j, best, arg)) {
      best = v;
      arg = j;
    }
  }
  for (int o = 16; o > 0; o /= 2) {
    const T other = __shfl_xor_sync(kFullMask, best, o);
    const int64_t other_arg = __shfl_xor_sync(kFullMask, arg, o);
    if (other_arg != kNoIndex && before(other, other_arg, best, arg)) {
      best = other;
      arg = other_arg;
    }
  }
  return __shfl_sync(kFullMask, arg, 0);
}

inline constexpr int kRowsPerPass = 4;

// Each warp's a, b and c (its lane 0's) summed over the block's kWarps warps by warp 0's fixed
// tree; true in warp 0, whose lanes all hold the sums.
template <int kWarps, typename A, typename B, typename C>
__device__ __forceinline__ bool block_sums(A& a, B& b, C& c) {
  __shared__ A sh_a[kWarps];
  __shared__ B sh_b[kWarps];
  __shared__ C sh_c[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    sh_a[warp] = a;
    sh_b[warp] = b;
    sh_c[warp] = c;
  }
  __syncthreads();
  if (warp != 0) return false;
  a = warp_reduce<SumOp>(lane < kWarps ? sh_a[lane] : A(0));
  b = warp_reduce<SumOp>(lane < kWarps ? sh_b[lane] : B(0));
  c = warp_reduce<SumOp>(lane < kWarps ? sh_c[lane] : C(0));
  return true;
}

// The cross-entropy loss: blocks of kCrossEntropyThreads, a block for each
// kCrossEntropyWarps * kRowsPerPass rows up to kCrossEntropyMaxBlocks (one SM's issue rate was
// the bound of a loss over a thousand rows in one block).
inline constexpr int kCrossEntropyThreads = 256;
inline constexpr int kCrossEntropyWarps = kCrossEntropyThreads / 32;
inline constexpr int kCrossEntropyMaxBlocks = 128;
inline unsigned cross_entropy_blocks(int64_t rows) {
  constexpr int64_t kRows = kCrossEntropyWarps * kRowsPerPass;
  const int64_t blocks = (rows + kRows - 1) / kRows;
  return static_cast<unsigned>(blocks < 1                        ? 1
                               : blocks > kCrossEntropyMaxBlocks ? kCrossEntropyMaxBlocks
                                                                 : blocks);
}

// What a cross-entropy loss over several blocks keeps in its stream's scratch
// (stream_libraries.h): each block's sums, and how many blocks have stored theirs. The launch sets
// `done` to 0 on its stream first (a memset before the kernel), so that a launch depends on no
// earlier one having left it right.
struct LossParts {
  unsigned done;
  double total[kCrossEntropyMaxBlocks];
  int64_t count[kCrossEntropyMaxBlocks], bad[kCrossEntropyMaxBlocks];
};

// Mean over non-ignored samples of logsumexp(row) - row[label]; 0 when all are ignored. Warp w of
// the W warps of the grid takes rows w, w + W, ... and works on kRowsPerPass of them at once, so
// that their loads are in flight together; each row's terms are those the gradient kernel
// computes for it alone (warp_rows_exp_sums), and the sum adds the rows in a fixed order: each
// warp's in turn, the block's warps by block_sums, then the blocks' sums (`parts`, used where
// there are several blocks) by the last block to finish, lane l those of blocks l, l + 32, ...,
// then the warp's tree.
template <typename T, typename L>
__global__ void __launch_bounds__(kCrossEntropyThreads)
    cross_entropy_kernel(const T* __restrict__ x, const L* __restrict__ labels, T* __restrict__ out,
                         int64_t rows, int64_t classes, int64_t ignore, LossParts* parts,
                         encore::cuda::DeviceErrorSlot errors, encore::cuda::DeviceErrorKind kind) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kCrossEntropyWarps;
  double total = 0;
  int64_t count = 0, bad = 0;
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * kCrossEntropyWarps + warp; first < rows;
       first += warps * kRowsPerPass) {
    const T* row[kRowsPerPass];
    int64_t label[kRowsPerPass];
    bool live[kRowsPerPass];  // uniform over the warp
#pragma unroll
    for (int k = 0; k < kRowsPerPass; ++k) {
      const int64_t i = first + k * warps;
      row[k] = x + i * classes;
      label[k] = i < rows ? static_cast<int64_t>(labels[i]) : ignore;
      live[k] = i < rows && label[k] != ignore;
      if (!live[k]) continue;
      ++count;
      if (label[k] < 0 || label[k] >= classes) {
        ++bad;
        live[k] = false;
        if (lane == 0)
          report_device_error(errors, kind, Op::SoftmaxCrossEntropy, label[k], i, classes);
      }
    }
    T m[kRowsPerPass], sum[kRowsPerPass];
    warp_rows_exp_sums(row, live, classes, lane, m, sum);
#pragma unroll
    for (int k = 0; k < kRowsPerPass; ++k) {
      if (!live[k]) continue;
      const T log_sum_exp = m[k] + dev_log(sum[k]);
      total += static_cast<double>(log_sum_exp - row[k][label[k]]);
    }
  }
  if (!block_sums<kCrossEntropyWarps>(total, count, bad)) return;  // warp 0 goes on
  if (gridDim.x > 1) {
    unsigned ticket = 0;
    if (lane == 0) {
      parts->total[blockIdx.x] = total;
      parts->count[blockIdx.x] = count;
      parts->bad[blockIdx.x] = bad;
      __threadfence();  // the sums are seen by whichever block counts the last ticket
      ticket = atomicAdd(&parts->done, 1u);
    }
    ticket = __shfl_sync(kFullMask, ticket, 0);
    __syncwarp();  // every lane's reads below come after lane 0's ticket
    if (ticket != gridDim.x - 1) return;
    __threadfence();
    const volatile LossParts* p = parts;
    total = 0;
    count = 0;
    bad = 0;
    for (unsigned b = lane; b < gridDim.x; b += 32) {
      total += p->total[b];
      count += p->count[b];
      bad += p->bad[b];
    }
    total = warp_reduce<SumOp>(total);
    count = warp_reduce<SumOp>(count);
    bad = warp_reduce<SumOp>(bad);
  }
  if (lane == 0) {
    *out = bad > 0      ? nan_of<T>()
           : count == 0 ? T(0)
                        : static_cast<T>(total / static_cast<double>(count));
  }
}

inline constexpr int kGradMaxBlocks = 128;

// The gradient's blocks: a warp per row, at most kGradMaxBlocks (each recounts the labels).
inline unsigned cross_entropy_grad_blocks(int64_t rows) {
  const unsigned blocks = blocks_for(rows, kThreads / 32);
  return blocks < kGradMaxBlocks ? blocks : kGradMaxBlocks;
}

// The cross-entropy gradient's factor: gy / count, count the rows whose label is not ignored (0
// when there are none).
template <typename T>
__device__ __forceinline__ T cross_entropy_grad_scale(T gy, int64_t count) {
  return count == 0 ? T(0) : gy / static_cast<T>(count);
}

// Row i's cross-entropy gradient by one warp, element j to store(j, v) for j < classes, lane l
// taking j = l, l + 32, ...: (softmax(row) - onehot(label)) * scale; 0 where label is `ignore`;
// NaN where it is out of [0, classes), which lane 0 reports as `op`'s where `report`. The gradient
// kernel's rows, and a product's a computed as such rows (loss_grad_gemm.cuh), with the same bits.
template <typename T, typename Store>
__device__ __forceinline__ void cross_entropy_grad_row(const T* row, int64_t label, int64_t i,
                                                       int64_t classes, int64_t ignore, T scale,
                                                       int lane, bool report, Op op,
                                                       encore::cuda::DeviceErrorSlot errors,
                                                       encore::cuda::DeviceErrorKind kind,
                                                       Store&& store) {
  if (label == ignore) {
    for (int64_t j = lane; j < classes; j += 32) store(j, T(0));
    return;
  }
  if (label < 0 || label >= classes) {
    for (int64_t j = lane; j < classes; j += 32) store(j, nan_of<T>());
    if (report && lane == 0) report_device_error(errors, kind, op, label, i, classes);
    return;
  }
  const T* one_row[1] = {row};
  const bool live[1] = {true};
  T m[1], sum[1];
  warp_rows_exp_sums(one_row, live, classes, lane, m, sum);
  const T f = scale / sum[0];
  for (int64_t j = lane; j < classes; j += 32) {
    T v = dev_exp(row[j] - m[0]) * f;
    if (j == label) v -= scale;
    store(j, v);
  }
}

// gx = (softmax(row) - onehot(label)) * gy / count on non-ignored rows, 0 on ignored rows; a bad
// label reported as `op`'s. gy and each warp's first label are loaded with the labels counted, not
// after their count.
template <typename T, typename L>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_grad_kernel(const T* __restrict__ x, const L* __restrict__ labels,
                              const T* __restrict__ gy, T* __restrict__ gx, int64_t rows,
                              int64_t classes, int64_t ignore, encore::cuda::DeviceErrorSlot errors,
                              encore::cuda::DeviceErrorKind kind, Op op) {
  dependent_launch_start();
  constexpr int kPerBlock = kThreads / 32;
  const int lane = threadIdx.x % 32;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kPerBlock + threadIdx.x / 32;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kPerBlock;
  const T g = *gy;
  int64_t label = first < rows ? static_cast<int64_t>(labels[first]) : 0;  // row i's, i from first
  __shared__ int64_t sh[32];
  int64_t count = 0;
  for (int64_t i = threadIdx.x; i < rows; i += kThreads)
    count += static_cast<int64_t>(labels[i]) != ignore ? 1 : 0;
  count = group_reduce<SumOp, kThreads>(count, sh);
  const T scale = cross_entropy_grad_scale(g, count);
  for (int64_t i = first; i < rows; i += step) {  // uniform over each warp
    if (i != first) label = static_cast<int64_t>(labels[i]);
    T* grow = gx + i * classes;
    cross_entropy_grad_row(x + i * classes, label, i, classes, ignore, scale, lane, true, op,
                           errors, kind, [&](int64_t j, T v) { grow[j] = v; });
  }
}

// mean((a - b)^2) over all elements, accumulated in double (0/0 = NaN for no elements).
template <typename T>
__global__ void __launch_bounds__(kLossThreads)
    mean_squared_error_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                              int64_t n) {
  __shared__ double sh[32];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += kLossThreads) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    acc += d * d;
  }
  acc = group_reduce<SumOp, kLossThreads>(acc, sh);
  if (threadIdx.x == 0) *out = static_cast<T>(acc / static_cast<double>(n));
}

// Fraction of non-ignored samples whose first maximum is at the label; 0 when none. A label
// outside [0, C) is reported as in cross_entropy_kernel and makes the result NaN.
template <typename T, typename L>
__global__ void __launch_bounds__(kLossThreads)
    accuracy_kernel(const T* __restrict__ x, const L* __restrict__ labels, T* __restrict__ out,
                    int64_t rows, int64_t classes, int64_t ignore,
                    encore::cuda::DeviceErrorSlot errors) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int64_t count = 0, correct = 0, bad = 0;
  for (int64_t i = warp; i < rows; i += kLossWarps) {  // uniform over each warp
    const int64_t label = static_cast<int64_t>(labels[i]);
    if (label == ignore) continue;
    ++count;
    if (label < 0 || label >= classes) {
      ++bad;
      if (lane == 0)
        report_device_error(errors, encore::cuda::DeviceErrorKind::Label, Op::Accuracy, label, i,
                            classes);
      continue;
    }
    correct += warp_first_argmax(x + i * classes, classes, lane) == label ? 1 : 0;
  }
  if (block_sums<kLossWarps>(count, correct, bad) && lane == 0) {
    *out = bad > 0      ? nan_of<T>()
           : count == 0 ? T(0)
                        : static_cast<T>(static_cast<double>(correct) / static_cast<double>(count));
  }
}

}  // namespace encore::kernels::cuda
