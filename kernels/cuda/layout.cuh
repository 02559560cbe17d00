// The layout CUDA kernels and their launch plans (layout.cu launches them), the semantics of
// kernels/cpu/layout.cc: permute, broadcast_to, concat, split, slice, slice_grad, and the
// planner's strided_copy. Except slice_grad they move elements without looking at them, so they
// run on unsigned integers of the dtype's size (concat and split on the widest unit their rows
// allow, one launch for up to 8 parts).
//
// Permute, broadcast_to and slice are one gather: out[i] = in[offset(i)] over the dimensions
// left after make_strided_loop has dropped size-1 dimensions and merged contiguous ones; a
// plain copy when that leaves one contiguous run, shared-memory tiles when the last two
// dimensions are swapped. Index arithmetic is 32-bit when both buffers have fewer than 2^32
// elements.
//
// The host compiles this file too, against stand-ins for the CUDA built-ins
// (tests/nvrtc/layout_emulated_test.cc runs the kernels on the host).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "kernels/cuda/grid.h"
#include "kernels/strided_loop.h"
#include "runtime/kernel_abi.h"
#include "runtime/strided_copy.h"

namespace encore::kernels::cuda {

// The loop dimensions and the input's element strides over them; the output is contiguous over
// the same dimensions, so its offset is the linear index itself.
struct Gather {
  int rank = 1;
  int64_t dims[kMaxRank] = {1};
  int64_t strides[kMaxRank] = {};
};

template <typename I>
__device__ __forceinline__ I input_offset(const Gather& g, I i) {
  I off = 0;
  for (int d = g.rank - 1; d > 0; --d) {
    const I dim = static_cast<I>(g.dims[d]);
    const I q = i / dim;
    off += (i - q * dim) * static_cast<I>(g.strides[d]);
    i = q;
  }
  return off + i * static_cast<I>(g.strides[0]);
}

template <typename I, typename U>
__global__ void gather_kernel(int64_t n, Gather g, U* out, const U* in) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = in[input_offset(g, static_cast<I>(i))];
}

inline constexpr int kTile = 32, kTileRows = 8;

// For every batch b: out_b [rows, cols] = in_b^T, where in_b's rows hold `in_stride` elements;
// out_b starts at b * rows * cols, in_b at input_offset(batch, b). One 32x32 tile per block and
// step, read along in_b's rows and written along out_b's rows. Blocks are (32, 8) threads.
template <typename U>
__global__ void transpose_kernel(int64_t batches, Gather batch, int64_t rows, int64_t cols,
                                 int64_t in_stride, U* out, const U* in) {
  __shared__ U tile[kTile][kTile + 1];
  const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int64_t b = blockIdx.z; b < batches; b += gridDim.z) {
    const U* in_b = in + input_offset(batch, static_cast<uint64_t>(b));
    U* out_b = out + b * rows * cols;
    for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
      for (int64_t ct = blockIdx.x; ct < col_tiles; ct += gridDim.x) {
        const int64_t r0 = rt * kTile, c0 = ct * kTile;
        // tile[jj][ii] = in_b[(c0 + jj) * in_stride + r0 + ii] = out_b[r0 + ii][c0 + jj].
        for (int jj = ty; jj < kTile; jj += kTileRows) {
          const int64_t i = r0 + tx, j = c0 + jj;
          if (i < rows && j < cols) tile[jj][tx] = in_b[j * in_stride + i];
        }
        __syncthreads();
        for (int ii = ty; ii < kTile; ii += kTileRows) {
          const int64_t i = r0 + ii, j = c0 + tx;
          if (i < rows && j < cols) out_b[i * cols + j] = tile[tx][ii];
        }
        __syncthreads();
      }
    }
  }
}

// How gather() runs a loop: a plain copy (one contiguous run), tiles (the last two dimensions
// swapped: a transpose, possibly batched, over `batches` [rows, cols] outputs whose inputs start
// at input_offset(batch, b) and hold rows of `in_stride`; the grid's x, y and z over the column
// tiles, row tiles and batches), or the general gather over `g`.
struct GatherPlan {
  enum Kind { kCopy, kTiles, kGeneral } kind = kGeneral;
  Gather g, batch;
  int64_t batches = 1, rows = 0, cols = 0, in_stride = 0;
  unsigned grid[3] = {1, 1, 1};
};
inline GatherPlan plan_gather(const StridedLoop<2>& loop) {
  GatherPlan plan;
  const int r = loop.rank;
  if (r == 1 && loop.strides[1][0] == 1) {
    plan.kind = GatherPlan::kCopy;
    return plan;
  }
  if (r >= 2 && loop.strides[1][r - 1] != 1 && loop.strides[1][r - 2] == 1 &&
      loop.dims[r - 1] >= 8 && loop.dims[r - 2] >= 8) {
    plan.kind = GatherPlan::kTiles;
    plan.batch.rank = r > 2 ? r - 2 : 1;
    for (int d = 0; d < r - 2; ++d) {
      plan.batch.dims[d] = loop.dims[d];
      plan.batch.strides[d] = loop.strides[1][d];
      plan.batches *= loop.dims[d];
    }
    plan.rows = loop.dims[r - 2];
    plan.cols = loop.dims[r - 1];
    plan.in_stride = loop.strides[1][r - 1];
    const int64_t tiles[3] = {(plan.cols + kTile - 1) / kTile, (plan.rows + kTile - 1) / kTile,
                              plan.batches};
    for (int d = 0; d < 3; ++d)
      plan.grid[d] = static_cast<unsigned>(std::min<int64_t>(tiles[d], 65535));
    return plan;
  }
  plan.g.rank = r;
  for (int d = 0; d < r; ++d) {
    plan.g.dims[d] = loop.dims[d];
    plan.g.strides[d] = loop.strides[1][d];
  }
  return plan;
}

// gx viewed as [outer, dim, inner]: gx[o, start + k*step, j] = gy[o, k, j] for k < count, and
// 0 elsewhere; each element written once.
template <typename I, typename T>
__global__ void slice_grad_elements(int64_t n, I dim, I inner, I start, I step, I count, T* gx,
                                    const T* gy) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += stride) {
    const I i = static_cast<I>(idx);
    const I t = i / inner;
    const I j = i - t * inner;
    const I o = t / dim;
    const I a = t - o * dim;
    T v = T(0);
    if (a >= start) {
      const I k = (a - start) / step;
      if (k * step == a - start && k < count) v = gy[(o * count + k) * inner + j];
    }
    gx[i] = v;
  }
}

inline constexpr int kPartsPerLaunch = 8;

// Up to kPartsPerLaunch parts side by side in each row of a whole, in units of W: part q holds
// row[q] units of every whole row, at units [start[q], start[q + 1]) of the group, which starts at
// unit `column` of a whole row (start[count] is the group's width).
template <typename I>
struct PartGroup {
  void* data[kPartsPerLaunch];
  I row[kPartsPerLaunch];
  I start[kPartsPerLaunch + 1];
  int count;
};

// n = outer * width units: kToWhole copies the parts into the whole (concat), else the whole's
// columns into the parts (split).
template <bool kToWhole, typename I, typename W>
__global__ void parts_copy_kernel(int64_t n, PartGroup<I> g, I whole_row, I column, W* whole) {
  const I width = g.start[g.count];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += stride) {
    const I i = static_cast<I>(idx);
    const I o = i / width, c = i - o * width;
    int q = 0;
    while (q + 1 < g.count && c >= g.start[q + 1]) ++q;
    W& w = whole[o * whole_row + column + c];
    W& x = static_cast<W*>(g.data[q])[o * g.row[q] + (c - g.start[q])];
    if constexpr (kToWhole)
      w = x;
    else
      x = w;
  }
}

// Pieces of a strided copy that write their part of an output at strides (a concat's parts), or
// of a step of several outputs, up to kPiecesPerLaunch in one launch: element i belongs to the
// first piece whose running element count `end` exceeds it.
inline constexpr int kPiecesPerLaunch = 8;
struct CopyPieces {
  int count = 0;
  int64_t end[kPiecesPerLaunch] = {};
  const void* in[kPiecesPerLaunch] = {};  // each piece's input
  void* out[kPiecesPerLaunch] = {};       // and output
  StridedPiece piece[kPiecesPerLaunch];
};

template <typename I, typename U>
__global__ void pieces_kernel(int64_t n, const __grid_constant__ CopyPieces pieces) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    int k = 0;
    while (i >= pieces.end[k]) ++k;
    const StridedPiece& p = pieces.piece[k];
    I j = static_cast<I>(i - (k > 0 ? pieces.end[k - 1] : 0));
    I in = 0, to = 0;
    for (int d = p.rank - 1; d > 0; --d) {
      const I dim = static_cast<I>(p.dims[d]);
      const I q = j / dim, r = j - q * dim;
      in += r * static_cast<I>(p.in_strides[d]);
      to += r * static_cast<I>(p.out_strides[d]);
      j = q;
    }
    in += j * static_cast<I>(p.in_strides[0]);
    to += j * static_cast<I>(p.out_strides[0]);
    static_cast<U*>(pieces.out[k])[p.out_offset + to] =
        static_cast<const U*>(pieces.in[k])[p.in_offset + in];
  }
}

// The pieces of a strided copy into `out`, in launches: gather(piece, input, output) for each
// piece writing its part of an output contiguously (a plain copy, or a tiled transpose) where the
// step has one output, and launch(batch, n, largest) for up to kPiecesPerLaunch others at a time
// (n: their elements; largest: the most elements of their outputs and inputs, which decides the
// index type). A step of several outputs (side by side chains from one buffer) runs every piece
// in those launches: one launch for up to kPiecesPerLaunch of them.
template <typename Gathered, typename Launch>
void for_each_copy_launch(std::span<const StridedPiece> pieces, std::span<const BufferView> in,
                          std::span<const BufferView> out, Gathered&& gather, Launch&& launch) {
  CopyPieces batch;
  int64_t n = 0, largest = 0;
  auto flush = [&] {
    if (n > 0) launch(batch, n, largest);
    batch = CopyPieces{};
    n = 0;
    largest = 0;
  };
  for (const StridedPiece& p : pieces) {
    const BufferView &input = in[p.input], &output = out[p.output];
    if (p.numel() == 0) continue;
    if (out.size() == 1 && p.contiguous_output()) {
      gather(p, input, output);
      continue;
    }
    batch.in[batch.count] = input.data;
    batch.out[batch.count] = output.data;
    batch.piece[batch.count] = p;
    n += p.numel();
    batch.end[batch.count++] = n;
    largest = std::max({largest, input.numel(), output.numel()});
    if (batch.count == kPiecesPerLaunch) flush();
  }
  flush();
}

}  // namespace encore::kernels::cuda
