// The kernels of the small GEMMs (runtime/small_gemm.h says which products run here;
// small_gemm.cu launches them): c [m, n] = op(a) op(b) over k, row-major, in one kernel whose
// order of operations depends on the shape alone, each output finished by a GemmFinish (a
// linear's bias, an activation, an activation gradient) before it is stored.
//
// These products wait on memory, not arithmetic: a few thousand outputs over a k of tens to
// hundreds, their operands in L2. So a block first copies its operands' part of a chunk of k into
// shared memory, every thread issuing all of its copies at once (asynchronous copies that hold no
// registers, async_copy.cuh; 16-byte vectors where the rows allow), one round trip to memory per
// chunk, then computes from there; the chunks follow one another along k, so each output's
// operations keep their order. What an output's finish reads (its bias, the activation
// gradient's input) is loaded with the first chunk, not after the product.
//
// - kDot (a [m, k], b stored [n, k]: a linear's forward): a block computes a kDotTile x kDotCols
//   strip of c, its warp w the kDotTile x kDotTile tile at columns w * kDotTile on. Lane l
//   multiplies and adds the products of k = l, l + 32, ... in that order, then the lanes' sums
//   meet in a shuffle butterfly (xor 16, 8, 4, 2, 1), each lane keeping half of the sums it
//   holds at each level but the last (16 shuffles, not 80), so that lanes 2q and 2q + 1 end with
//   sum q = i*4 + j of the tile, which lane 2q stores. Each sum is the butterfly's: at each level
//   the two partial sums of the lanes that differ in that bit, whichever lane adds them.
// - kSerialK (b stored [k, n], a [m, k] or stored [k, m]: a product's backward): a thread
//   computes kSerialRows outputs of one column of c (one, when c is small), multiplying and adding
//   over k = 0, 1, ... in order; a block's threads take adjacent columns. With a stored [k, m] it
//   can also sum a's columns (a linear's bias gradient beside its weight gradient): blocks after
//   the product's take a column of a per thread (coalesced loads) and add it up in the order of
//   CUDA's column sum (column_sum.cuh), beside the product's blocks.
//
// Each multiply-add is one fused multiply-add (fma_of); the file is compiled without contraction
// (nvcc -fmad=false), so everything else rounds as the unfused kernels do, and an activation
// applied here gives the bits of the elementwise kernel applying it to the stored product.
//
// The host compiles this file too, against stand-ins for the CUDA built-ins (the tests run the
// kernels on the host: tests/nvrtc/small_gemm_emulated_test.cc); it includes element_ops.cuh,
// async_copy.cuh, column_sum.cuh, dependent_launch.cuh, dynamic_shared.cuh, pack.cuh and
// runtime/ops.h only.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/column_sum.cuh"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/dynamic_shared.cuh"
#include "kernels/cuda/element_ops.cuh"
#include "kernels/cuda/pack.cuh"
#include "runtime/ops.h"

namespace encore::kernels::cuda {

inline constexpr int kSmallGemmThreads = 128;  // a block of either kernel: 4 warps
inline constexpr int kDotTile = 4;             // kDot: a warp's tile of c is kDotTile x kDotTile
inline constexpr int kDotCols = kSmallGemmThreads / 32 * kDotTile;  // kDot: a block's columns
// kSerialK: a thread computes kSerialRows outputs down a column, or one where c has fewer than
// kSerialFewOutputs outputs (more blocks, each staging fewer rows of a); a block's threads take
// kSmallGemmThreads adjacent columns (those past c's edge only stage).
inline constexpr int kSerialRows = 4;
inline constexpr int64_t kSerialFewOutputs = 16384;
// The chunk of k staged at a time: all of k where it fits, so that a short k reserves little
// shared memory (more blocks fit on an SM), at most as much as kMaxDynamicSharedBytes (64 KiB of
// dynamic shared memory, dynamic_shared.cuh) holds. kDot stages that much, rounded up to 32
// elements (its lanes), of each of the block's kDotTile rows of a and kDotCols rows of b (at most
// 800 floats or 384 doubles: a linear's k of up to 800 floats in one round trip); kSerialK, that
// many rows of b's kSmallGemmThreads columns and of the block's kRows rows of a (at most 124
// floats or 62 doubles at kRows = 4, 126 or 63 at 1).
template <typename T>
inline constexpr int kDotMaxChunk = kMaxDynamicSharedBytes /
                                    ((kDotTile + kDotCols) * static_cast<int>(sizeof(T))) / 32 * 32;
// kSerialK's bytes past a's staged rows, the last of its shared memory: the product loop
// (serial_products, unrolled) loads a's row in 16-byte vectors and may load the vector past the
// chunk's last element, which it never uses; compute-sanitizer's memcheck reported a 16-byte
// load out of bounds when the launch reserved a's rows and no more (on an H200, in a deep MLP of
// 8-wide linears). The slack is one unrolled round of the loop.
inline constexpr int kSerialReadSlackBytes = 64;
template <typename T, int kRows>
inline constexpr int kSerialMaxChunk = (kMaxDynamicSharedBytes - kSerialReadSlackBytes) /
                                       ((kSmallGemmThreads + kRows) * static_cast<int>(sizeof(T)));
static_assert(kDotMaxChunk<double> >= 32 && kSerialMaxChunk<double, kSerialRows> >= 1);
template <typename T>
int dot_chunk(int64_t k) {
  const int64_t rounded = (std::max<int64_t>(k, 1) + 31) / 32 * 32;
  return static_cast<int>(std::min<int64_t>(rounded, kDotMaxChunk<T>));
}
template <typename T, int kRows>
int serial_chunk(int64_t k) {
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(k, 1), kSerialMaxChunk<T, kRows>));
}

// The dynamic shared memory of a launch of either kernel staging `chunk` of k at a time.
template <typename T>
size_t dot_shared_bytes(int chunk) {
  return static_cast<size_t>(kDotTile + kDotCols) * static_cast<size_t>(chunk) * sizeof(T);
}
template <typename T, int kRows>
size_t serial_shared_bytes(int chunk) {
  return static_cast<size_t>(kSmallGemmThreads + kRows) * static_cast<size_t>(chunk) * sizeof(T) +
         kSerialReadSlackBytes;
}

// The grid of the kDot (dot) or kSerialK kernel for c [m, n]: `blocks` blocks of
// kSmallGemmThreads, and for kSerialK the outputs per thread; with `sums` (kSerialK), the blocks
// summing a's m columns follow the product's. How the work is cut changes no output's order of
// operations.
struct GemmLaunch {
  unsigned blocks;
  int rows;
};
inline GemmLaunch small_gemm_launch(bool dot, int64_t m, int64_t n, bool sums = false) {
  if (dot) {
    const int64_t blocks = (m + kDotTile - 1) / kDotTile * ((n + kDotCols - 1) / kDotCols);
    return {static_cast<unsigned>(blocks), 1};
  }
  const int rows = m * n < kSerialFewOutputs ? 1 : kSerialRows;
  constexpr int64_t kWidth = kSmallGemmThreads;
  const int64_t blocks =
      (m + rows - 1) / rows * ((n + kWidth - 1) / kWidth) + (sums ? (m + kWidth - 1) / kWidth : 0);
  return {static_cast<unsigned>(blocks), rows};
}

// The elements of T in a 16-byte vector: what stage() copies at a time.
template <typename T>
inline constexpr int kVec16 = 16 / static_cast<int>(sizeof(T));

// Whether the rows of a matrix at p, ld elements apart, can be staged in 16-byte vectors: p
// aligned for them and ld a multiple of one (the chunks start at multiples of one).
template <typename T>
bool stages_vectors(const T* p, int64_t ld) {
  return aligned_for<T, kVec16<T>>(p) && ld % kVec16<T> == 0;
}

// How each output v of the product is finished before it is stored at c[at] (row r, column j):
// v + bias[j] where there is a bias (a linear's), then, when `act` is an activation, act(v);
// when it is an activation gradient, act(act_in[at], v) (MatmulActGrad: act_in is what the
// gradient reads, its forward's output or input, laid out as c). `scalar` is leaky_relu's slope or
// gelu's form. Op::Matmul: nothing more. `sums` (kSerialK with a stored [k, m] only): where
// a's column sums go, sums[r] = a[0, r] + ... + a[k - 1, r] (sum(a, 0), as reduce.cuh adds it).
template <typename T>
struct GemmFinish {
  const T* bias = nullptr;
  const T* act_in = nullptr;
  Op act = Op::Matmul;
  T scalar = 0;
  T* sums = nullptr;
};

// What the finish of output c[at] (column j) reads besides the product: the bias element and
// the activation gradient's input, loaded when a kernel starts, with its first operands, rather
// than after its product (one round trip to memory fewer before the store).
template <typename T>
struct FinishInputs {
  T bias = 0, act_in = 0;
};

// Whether `act` is an activation gradient, which reads act_in.
__host__ __device__ constexpr bool reads_act_in(Op act) {
  return act == Op::ReluGrad || act == Op::LeakyReluGrad || act == Op::SigmoidGrad ||
         act == Op::TanhGrad || act == Op::GeluGrad;
}

template <typename T>
__device__ __forceinline__ FinishInputs<T> finish_inputs(const GemmFinish<T>& f, int64_t at,
                                                         int64_t j) {
  FinishInputs<T> in;
  if (f.bias != nullptr) in.bias = f.bias[j];
  if (reads_act_in(f.act)) in.act_in = f.act_in[at];
  return in;
}

template <typename T>
__device__ __forceinline__ T finish(const GemmFinish<T>& f, const FinishInputs<T>& in, T v) {
  if (f.bias != nullptr) v = el::add(v, in.bias);
  switch (f.act) {
    case Op::Relu:
      return el::relu(v);
    case Op::LeakyRelu:
      return el::leaky_relu(v, f.scalar);
    case Op::Sigmoid:
      return el::sigmoid(v);
    case Op::Tanh:
      return el::tanh(v);
    case Op::Gelu:
      return el::gelu(v, f.scalar);
    case Op::ReluGrad:
      return el::relu_grad(in.act_in, v, f.scalar);
    case Op::LeakyReluGrad:
      return el::leaky_relu_grad(in.act_in, v, f.scalar);
    case Op::SigmoidGrad:
      return el::sigmoid_grad(in.act_in, v, f.scalar);
    case Op::TanhGrad:
      return el::tanh_grad(in.act_in, v, f.scalar);
    case Op::GeluGrad:
      return el::gelu_grad(in.act_in, v, f.scalar);
    default:
      return v;
  }
}

// min(limit, left) as an int (limit is one).
__device__ __forceinline__ int smaller(int64_t limit, int64_t left) {
  return static_cast<int>(left < limit ? left : limit);
}

// Copies a block of a matrix into shared memory at dst: `dst_rows` rows there, `dst_ld` elements
// apart, of which the first `width` (a multiple of kVec16<T>, at most dst_ld) are written;
// element (i, p) is src[i * ld + p] for i < src_rows and p < src_cols, 0 past them (not read).
// The block's kSmallGemmThreads threads (its blockDim.x) share the copies (async_copy.cuh),
// 16-byte vectors where `vectors` (src and ld allow them: stages_vectors), element by element in
// the last vector of a row that ends inside it; the caller waits for them (wait_async_copies)
// before its barrier.
template <typename T>
__device__ __forceinline__ void stage(T* __restrict__ dst, const T* __restrict__ src, int64_t ld,
                                      int dst_rows, int dst_ld, int width, int src_rows,
                                      int src_cols, bool vectors) {
  constexpr int kSize = kVec16<T>;
  const int row_vectors = width / kSize;
  // Thread t copies vectors t, t + kSmallGemmThreads, ...: (row i, vector v of it), stepping on
  // without dividing.
  const int step_rows = kSmallGemmThreads / row_vectors,
            step_vectors = kSmallGemmThreads % row_vectors;
  int i = static_cast<int>(threadIdx.x) / row_vectors,
      v = static_cast<int>(threadIdx.x) % row_vectors;
#pragma unroll 4
  for (; i < dst_rows; i += step_rows, v += step_vectors) {
    if (v >= row_vectors) {
      v -= row_vectors;
      if (++i >= dst_rows) break;
    }
    const int p = v * kSize;
    T* to = dst + i * dst_ld + p;
    const T* from = src + i * ld + p;
    if (i < src_rows && vectors && p + kSize <= src_cols) {
      copy_async<16>(to, from);
    } else {
#pragma unroll
      for (int e = 0; e < kSize; ++e) {
        if (i < src_rows && p + e < src_cols) {
          copy_async<sizeof(T)>(to + e, from + e);
        } else {
          to[e] = T(0);
        }
      }
    }
  }
}

// Level kO (16, 8, 4, 2) of kDot's butterfly and those below it, on the kO sums lane `lane` holds
// in v[0, kO): it keeps the upper half where it has bit kO, the lower half where not, and adds to
// each the partial sum of the same output from lane ^ kO (which keeps the other half); the sums
// kept move to v[0, kO / 2). Levels as template arguments, so every index is a constant (the
// sums stay in registers).
static_assert(kDotTile * kDotTile == 16);
template <int kO, typename T>
__device__ __forceinline__ void halve_sums(T (&v)[kDotTile * kDotTile], int lane) {
  if constexpr (kO > 1) {
    const bool upper = (lane & kO) != 0;
#pragma unroll
    for (int s = 0; s < kO / 2; ++s) {
      const T keep = upper ? v[kO / 2 + s] : v[s], give = upper ? v[s] : v[kO / 2 + s];
      v[s] = el::add(keep, __shfl_xor_sync(0xffffffffu, give, kO));
    }
    halve_sums<kO / 2>(v, lane);
  }
}

// kDot, launched as small_gemm_launch says, with dot_shared_bytes<T>(chunk) of dynamic shared
// memory, chunk = dot_chunk<T>(k): block b computes rows b / col_blocks * kDotTile on, columns
// b % col_blocks * kDotCols on; its warp w the tile at columns w * kDotTile on. Staged per chunk of
// k: the strip's kDotTile rows of a and kDotCols rows of b. Rows past c's edge are staged as 0 and
// store nothing. vectors_a, vectors_b: stages_vectors(a, lda), stages_vectors(b, ldb).
template <typename T>
__global__ void __launch_bounds__(kSmallGemmThreads)
    gemm_dot_kernel(int64_t m, int64_t n, int64_t k, int chunk, const T* __restrict__ a,
                    int64_t lda, bool vectors_a, const T* __restrict__ b, int64_t ldb,
                    bool vectors_b, T* __restrict__ c, int64_t ldc, GemmFinish<T> f) {
  dependent_launch_start();
  // kDotTile rows of `chunk` (a's), then kDotCols (b's); chunk is a multiple of 32 elements, so
  // every row starts 16-byte aligned.
  T* as = reinterpret_cast<T*>(dynamic_shared());
  T* bs = as + kDotTile * chunk;
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int64_t col_blocks = (n + kDotCols - 1) / kDotCols;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) / col_blocks * kDotTile;
  const int64_t jb = static_cast<int64_t>(blockIdx.x) % col_blocks * kDotCols;
  const int rows = smaller(kDotTile, m - r0);
  const int cols = smaller(kDotCols, n - jb);
  // Lane 2q stores output q = i * kDotTile + j of the warp's tile ((i, j)), if inside c.
  const int64_t j0 = jb + warp * kDotTile;
  const int q = lane / 2;
  const int64_t out_r = r0 + q / kDotTile, out_j = j0 + q % kDotTile;
  const bool stores = lane % 2 == 0 && out_r < m && out_j < n;
  const int64_t at = out_r * ldc + out_j;
  const FinishInputs<T> in = stores ? finish_inputs(f, at, out_j) : FinishInputs<T>{};
  T acc[kDotTile][kDotTile] = {};
  for (int64_t base = 0; base < k; base += chunk) {
    const int kc = smaller(chunk, k - base);
    if (base > 0) __syncthreads();  // every warp is done with the last chunk
    // The kc columns the chunk reads, to a whole vector (what lies past them is not read).
    const int width = (kc + kVec16<T> - 1) / kVec16<T> * kVec16<T>;
    stage(as, a + r0 * lda + base, lda, kDotTile, chunk, width, rows, kc, vectors_a);
    stage(bs, b + jb * ldb + base, ldb, kDotCols, chunk, width, cols, kc, vectors_b);
    wait_async_copies();
    __syncthreads();
#pragma unroll 4
    for (int p = lane; p < kc; p += 32) {
      T av[kDotTile], bv[kDotTile];
#pragma unroll
      for (int i = 0; i < kDotTile; ++i) {
        av[i] = as[i * chunk + p];
        bv[i] = bs[(warp * kDotTile + i) * chunk + p];
      }
#pragma unroll
      for (int i = 0; i < kDotTile; ++i)
#pragma unroll
        for (int j = 0; j < kDotTile; ++j) acc[i][j] = fma_of(av[i], bv[j], acc[i][j]);
    }
  }
  // The butterfly over the 32 lanes' partial sums, halving what a lane holds (halve_sums); at
  // level 1 both lanes of a pair hold output q = lane / 2 (its bits are the lane's bits 4 to 1:
  // the halves each level kept).
  T v[kDotTile * kDotTile];
#pragma unroll
  for (int i = 0; i < kDotTile; ++i)
#pragma unroll
    for (int j = 0; j < kDotTile; ++j) v[i * kDotTile + j] = acc[i][j];
  halve_sums<16>(v, lane);
  v[0] = el::add(v[0], __shfl_xor_sync(0xffffffffu, v[0], 1));
  if (stores) c[at] = finish(f, in, v[0]);
}

// kSerialK's multiply-adds over a staged chunk of kc elements of k: thread t's column of b's rows
// (bs, kSmallGemmThreads apart) times the block's kRows rows of a (as, `chunk` apart), in order
// along k.
template <typename T, int kRows>
__device__ __forceinline__ void serial_products(const T* as, const T* bs, int chunk, int kc, int t,
                                                T (&acc)[kRows]) {
#pragma unroll 16
  for (int p = 0; p < kc; ++p) {
    const T bv = bs[p * kSmallGemmThreads + t];
#pragma unroll
    for (int i = 0; i < kRows; ++i) acc[i] = fma_of(as[i * chunk + p], bv, acc[i]);
  }
}

// What kSerialK's stores below finish with, loaded as the kernel starts.
template <typename T, int kRows>
__device__ __forceinline__ void serial_finish_inputs(int64_t m, int64_t n, int64_t r0, int64_t j,
                                                     int64_t ldc, const GemmFinish<T>& f,
                                                     FinishInputs<T> (&in)[kRows]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i)
    if (j < n && r0 + i < m) in[i] = finish_inputs(f, (r0 + i) * ldc + j, j);
}

// kSerialK's stores: row r0 + i, column j of c, finished, for the rows and column inside c.
template <typename T, int kRows>
__device__ __forceinline__ void serial_store(int64_t m, int64_t n, int64_t r0, int64_t j, T* c,
                                             int64_t ldc, const GemmFinish<T>& f,
                                             const FinishInputs<T> (&in)[kRows],
                                             const T (&acc)[kRows]) {
  if (j >= n) return;
#pragma unroll
  for (int i = 0; i < kRows; ++i)
    if (r0 + i < m) c[(r0 + i) * ldc + j] = finish(f, in[i], acc[i]);
}

// kSerialK's product for the block's kRows rows from r0 and kSmallGemmThreads columns from j0 (cols
// of them inside c), thread t column j0 + t, into acc: per chunk of k (`chunk` elements of it at a
// time, serial_chunk), those rows of b and the block's rows of a staged in dynamic shared memory
// (serial_shared_bytes), past c's edge as 0. a's element (row r, p) is a[r * lda + p], or
// a[p * lda + r] when trans_a (a stored [k, m]). vectors_b: stages_vectors(b, ldb).
template <typename T, int kRows>
__device__ __forceinline__ void serial_product(int64_t m, int64_t k, int chunk, bool trans_a,
                                               const T* __restrict__ a, int64_t lda,
                                               const T* __restrict__ b, int64_t ldb, bool vectors_b,
                                               int64_t r0, int64_t j0, int cols, T (&acc)[kRows]) {
  constexpr int kWidth = kSmallGemmThreads;
  // `chunk` rows of kWidth (b's, 16-byte aligned), then kRows rows of `chunk` (a's).
  T* bs = reinterpret_cast<T*>(dynamic_shared());
  T* as = bs + chunk * kWidth;
  const int t = static_cast<int>(threadIdx.x);
  for (int64_t base = 0; base < k; base += chunk) {
    const int kc = smaller(chunk, k - base);
    if (base > 0) __syncthreads();  // every thread is done with the last chunk
    // The kc rows of b and columns of a's rows the chunk reads (what lies past them is not).
    // a's rows are copied with b's, adjacent threads on adjacent elements: along a row of a
    // (row i, column p, stepping on without dividing), or of a stored [k, m].
    auto copy_a = [&](int i, int p) {
      const int64_t r = r0 + i, q = base + p;
      if (r < m) {
        copy_async<sizeof(T)>(&as[i * chunk + p], a + (trans_a ? q * lda + r : r * lda + q));
      } else {
        as[i * chunk + p] = T(0);
      }
    };
    if (trans_a) {
      for (int e = t; e < kRows * kc; e += kWidth) copy_a(e % kRows, e / kRows);
    } else {
      const int step_rows = kWidth / kc, step_cols = kWidth % kc;
      for (int i = t / kc, p = t % kc; i < kRows; i += step_rows, p += step_cols) {
        if (p >= kc) {
          p -= kc;
          if (++i >= kRows) break;
        }
        copy_a(i, p);
      }
    }
    stage(bs, b + base * ldb + j0, ldb, kc, kWidth, kWidth, kc, cols, vectors_b);
    wait_async_copies();
    __syncthreads();
    serial_products<T, kRows>(as, bs, chunk, kc, t, acc);
  }
}

// kSerialK, launched as small_gemm_launch says, with serial_shared_bytes<T, kRows>(chunk) of
// dynamic shared memory, chunk = serial_chunk<T, kRows>(k): block b computes kRows rows from
// b / col_blocks * kRows on, in the kSmallGemmThreads columns from b % col_blocks *
// kSmallGemmThreads on, thread t column t of them (serial_product), and stores them finished. With
// f.sums (trans_a), the blocks after those store a's column sums, thread r of them column r.
template <typename T, int kRows>
__global__ void __launch_bounds__(kSmallGemmThreads)
    gemm_serial_k_kernel(int64_t m, int64_t n, int64_t k, int chunk, bool trans_a,
                         const T* __restrict__ a, int64_t lda, const T* __restrict__ b, int64_t ldb,
                         bool vectors_b, T* __restrict__ c, int64_t ldc, GemmFinish<T> f) {
  dependent_launch_start();
  constexpr int kWidth = kSmallGemmThreads;
  const int64_t col_blocks = (n + kWidth - 1) / kWidth;
  const int64_t product_blocks = (m + kRows - 1) / kRows * col_blocks;
  if (static_cast<int64_t>(blockIdx.x) >= product_blocks) {  // a's column sums (f.sums set)
    const int64_t r = (blockIdx.x - product_blocks) * kWidth + threadIdx.x;
    if (r < m) f.sums[r] = column_sum_in_order(a + r, lda, k);
    return;
  }
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) / col_blocks * kRows;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) % col_blocks * kWidth;
  const int64_t j = j0 + threadIdx.x;
  FinishInputs<T> in[kRows];
  serial_finish_inputs<T, kRows>(m, n, r0, j, ldc, f, in);
  T acc[kRows] = {};
  serial_product<T, kRows>(m, k, chunk, trans_a, a, lda, b, ldb, vectors_b, r0, j0,
                           smaller(kWidth, n - j0), acc);
  serial_store<T, kRows>(m, n, r0, j, c, ldc, f, in, acc);
}

}  // namespace encore::kernels::cuda
