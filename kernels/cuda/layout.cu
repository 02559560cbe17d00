// Layout CUDA kernels, the same semantics as kernels/cpu/layout.cc: permute, broadcast_to,
// concat, split, slice, slice_grad, and the planner's strided_copy. Except slice_grad they move
// elements without looking at them, so they run on unsigned integers of the dtype's size (concat
// and split on the widest unit their rows allow, one launch for up to 8 parts).
//
// Permute, broadcast_to and slice are one gather: out[i] = in[offset(i)] over the dimensions
// left after make_strided_loop has dropped size-1 dimensions and merged contiguous ones; a
// plain copy when that leaves one contiguous run, shared-memory tiles when the last two
// dimensions are swapped. Index arithmetic is 32-bit when both buffers have fewer than 2^32
// elements.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/strided_loop.h"

namespace encore::kernels::cuda {
namespace {

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

constexpr int kTile = 32, kTileRows = 8;

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

// out (contiguous, operand 0 of `loop`, n elements) = in read with the strides of operand 1,
// whose offsets stay below in_numel.
template <typename U>
void gather(Op op, U* out, const U* in, const StridedLoop<2>& loop, int64_t n, int64_t in_numel) {
  if (n == 0) return;
  const int r = loop.rank;
  if (r == 1 && loop.strides[1][0] == 1) {
    ENCORE_CUDA_OK(op, cudaMemcpyAsync(out, in, n * sizeof(U), cudaMemcpyDeviceToDevice, stream()));
    return;
  }
  // The last two dimensions swapped (a transpose, possibly batched): tile them.
  if (r >= 2 && loop.strides[1][r - 1] != 1 && loop.strides[1][r - 2] == 1 &&
      loop.dims[r - 1] >= 8 && loop.dims[r - 2] >= 8) {
    Gather batch;
    int64_t batches = 1;
    batch.rank = r > 2 ? r - 2 : 1;
    for (int d = 0; d < r - 2; ++d) {
      batch.dims[d] = loop.dims[d];
      batch.strides[d] = loop.strides[1][d];
      batches *= loop.dims[d];
    }
    const int64_t rows = loop.dims[r - 2], cols = loop.dims[r - 1];
    const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(col_tiles, 65535)),
                    static_cast<unsigned>(std::min<int64_t>(row_tiles, 65535)),
                    static_cast<unsigned>(std::min<int64_t>(batches, 65535)));
    transpose_kernel<<<grid, dim3(kTile, kTileRows), 0, stream()>>>(
        batches, batch, rows, cols, loop.strides[1][r - 1], out, in);
    ENCORE_CUDA_LAUNCHED(op);
    return;
  }
  Gather g;
  g.rank = r;
  for (int d = 0; d < r; ++d) {
    g.dims[d] = loop.dims[d];
    g.strides[d] = loop.strides[1][d];
  }
  with_index_type(std::max(n, in_numel), [&]<typename I>(Type<I>) {
    gather_kernel<I><<<blocks_for(n), kThreads, 0, stream()>>>(n, g, out, in);
    ENCORE_CUDA_LAUNCHED(op);
  });
}

// out.shape[d] = x.shape[perm[d]].
void permute_kernel(const KernelArgs& args) {
  const BufferView &x = args.in[0], &out = args.out[0];
  const PermuteAttrs& attrs = args.attr<PermuteAttrs>();
  int64_t x_strides[kMaxRank];
  contiguous_strides(x.shape, x_strides);
  int64_t strides[2][kMaxRank];
  contiguous_strides(out.shape, strides[0]);
  for (int d = 0; d < out.shape.rank(); ++d) strides[1][d] = x_strides[attrs.perm[d]];
  const StridedLoop<2> loop = make_strided_loop<2>(out.shape.rank(), out.shape.begin(), strides);
  switch_itemsize(x.dtype, Op::Permute, [&]<typename U>(Type<U>) {
    gather(Op::Permute, out.as<U>(), x.as<U>(), loop, out.numel(), x.numel());
  });
}

void broadcast_to_kernel(const KernelArgs& args) {
  const BufferView &x = args.in[0], &out = args.out[0];
  const StridedLoop<2> loop = broadcast_loop<2>(out.shape, {&x.shape});
  switch_itemsize(x.dtype, Op::BroadcastTo, [&]<typename U>(Type<U>) {
    gather(Op::BroadcastTo, out.as<U>(), x.as<U>(), loop, out.numel(), x.numel());
  });
}

// y = x[..., start : stop : step, ...]: y viewed as [outer, count, inner] reads x from
// x + start*inner with strides [dim*inner, step*inner, 1].
void slice_kernel(const KernelArgs& args) {
  const BufferView &x = args.in[0], &y = args.out[0];
  const SliceAttrs& attrs = args.attr<SliceAttrs>();
  if (y.numel() == 0) return;
  const AxisSplit split = split_at(x.shape, static_cast<int>(attrs.axis));
  const int64_t count = y.shape[static_cast<int>(attrs.axis)];
  // A step past the axis length gives one position at most (count <= 1, a dimension the loop
  // drops): clamping it keeps step * inner from overflowing.
  const int64_t step = std::min(attrs.step, split.n);
  const int64_t dims[3] = {split.outer, count, split.inner};
  const int64_t strides[2][kMaxRank] = {{count * split.inner, split.inner, 1},
                                        {split.n * split.inner, step * split.inner, 1}};
  const StridedLoop<2> loop = make_strided_loop<2>(3, dims, strides);
  switch_itemsize(x.dtype, Op::Slice, [&]<typename U>(Type<U>) {
    gather(Op::Slice, y.as<U>(), x.as<U>() + attrs.start * split.inner, loop, y.numel(), x.numel());
  });
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

void slice_grad_kernel(const KernelArgs& args) {
  const BufferView &gy = args.in[0], &gx = args.out[0];
  const SliceAttrs& attrs = args.attr<SliceAttrs>();
  switch_floating(gx.dtype, Op::SliceGrad, [&]<typename T>(Type<T>) {
    const int64_t n = gx.numel();
    if (n == 0) return;
    const AxisSplit split = split_at(gx.shape, static_cast<int>(attrs.axis));
    const int64_t count = gy.shape[static_cast<int>(attrs.axis)];
    // A step past the axis length gives one position at most (count <= 1): clamping it keeps
    // that and fits I.
    const int64_t step = std::min(attrs.step, split.n);
    with_index_type(n, [&]<typename I>(Type<I>) {
      slice_grad_elements<I><<<blocks_for(n), kThreads, 0, stream()>>>(
          n, static_cast<I>(split.n), static_cast<I>(split.inner), static_cast<I>(attrs.start),
          static_cast<I>(step), static_cast<I>(count), gx.as<T>(), gy.as<T>());
      ENCORE_CUDA_LAUNCHED(Op::SliceGrad);
    });
  });
}

constexpr int kPartsPerLaunch = 8;

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

// One launch for a group of parts whose row sizes (bytes) are `rows`, starting `column_bytes`
// into each whole row.
template <bool kToWhole, typename W>
void parts_copy(Op op, int64_t outer, std::span<const BufferView> parts, const int64_t* rows,
                int64_t whole_row_bytes, int64_t column_bytes, char* whole) {
  constexpr int64_t w = sizeof(W);
  int64_t width = 0;
  for (size_t q = 0; q < parts.size(); ++q) width += rows[q] / w;
  const int64_t n = outer * width;
  with_index_type(outer * (whole_row_bytes / w), [&]<typename I>(Type<I>) {
    PartGroup<I> g{};
    g.count = static_cast<int>(parts.size());
    I start = 0;
    for (size_t q = 0; q < parts.size(); ++q) {
      g.data[q] = parts[q].data;
      g.row[q] = static_cast<I>(rows[q] / w);
      g.start[q] = start;
      start += g.row[q];
    }
    g.start[parts.size()] = start;
    parts_copy_kernel<kToWhole, I><<<blocks_for(n), kThreads, 0, stream()>>>(
        n, g, static_cast<I>(whole_row_bytes / w), static_cast<I>(column_bytes / w),
        reinterpret_cast<W*>(whole));
    ENCORE_CUDA_LAUNCHED(op);
  });
}

// Concat (kToWhole) or Split: one launch per kPartsPerLaunch parts, in units of the widest of 16,
// 8, 4, 2, 1 bytes that divides the group's row sizes, its column and every address.
template <bool kToWhole>
void concat_or_split(Op op, const BufferView& whole, std::span<const BufferView> parts, int axis) {
  const AxisSplit split = split_at(whole.shape, axis);
  const int64_t item = static_cast<int64_t>(itemsize(whole.dtype));
  const int64_t whole_row = whole.shape[axis] * split.inner * item;
  char* pw = static_cast<char*>(whole.data);
  int64_t column = 0;  // bytes into each whole row where the current group goes
  for (size_t first = 0; first < parts.size(); first += kPartsPerLaunch) {
    const std::span<const BufferView> group =
        parts.subspan(first, std::min<size_t>(kPartsPerLaunch, parts.size() - first));
    int64_t rows[kPartsPerLaunch];
    int64_t width = 0;
    uint64_t bits = static_cast<uint64_t>(whole_row | column) | reinterpret_cast<uintptr_t>(pw);
    for (size_t q = 0; q < group.size(); ++q) {
      rows[q] = group[q].shape[axis] * split.inner * item;
      width += rows[q];
      bits |= static_cast<uint64_t>(rows[q]) | reinterpret_cast<uintptr_t>(group[q].data);
    }
    if (width != 0 && split.outer != 0) {
      if (bits % 16 == 0)
        parts_copy<kToWhole, uint4>(op, split.outer, group, rows, whole_row, column, pw);
      else if (bits % 8 == 0)
        parts_copy<kToWhole, uint64_t>(op, split.outer, group, rows, whole_row, column, pw);
      else if (bits % 4 == 0)
        parts_copy<kToWhole, uint32_t>(op, split.outer, group, rows, whole_row, column, pw);
      else if (bits % 2 == 0)
        parts_copy<kToWhole, uint16_t>(op, split.outer, group, rows, whole_row, column, pw);
      else
        parts_copy<kToWhole, uint8_t>(op, split.outer, group, rows, whole_row, column, pw);
    }
    column += width;
  }
}

void concat_kernel(const KernelArgs& args) {
  concat_or_split<true>(Op::Concat, args.out[0], args.in, args.attr<AxisAttrs>().axis);
}

void split_kernel(const KernelArgs& args) {
  concat_or_split<false>(Op::Split, args.in[0], args.out, args.attr<AxisAttrs>().axis);
}

// ---- strided_copy (runtime/strided_copy.h) --------------------------------------------------

// Pieces of a strided copy that write their part of the output at strides (a concat's parts),
// up to kPiecesPerLaunch in one launch: element i belongs to the first piece whose running
// element count `end` exceeds it.
constexpr int kPiecesPerLaunch = 8;
struct CopyPieces {
  int count = 0;
  int64_t end[kPiecesPerLaunch] = {};
  const void* in[kPiecesPerLaunch] = {};  // each piece's input
  StridedPiece piece[kPiecesPerLaunch];
};

template <typename I, typename U>
__global__ void pieces_kernel(int64_t n, const __grid_constant__ CopyPieces pieces, U* out) {
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
    out[p.out_offset + to] = static_cast<const U*>(pieces.in[k])[p.in_offset + in];
  }
}

// A piece writing its part of the output contiguously is a gather (a plain copy, or a tiled
// transpose); the others go in launches of up to kPiecesPerLaunch.
void strided_copy_kernel(const KernelArgs& args) {
  const BufferView& out = args.out[0];
  switch_itemsize(out.dtype, Op::StridedCopy, [&]<typename U>(Type<U>) {
    CopyPieces batch;
    int64_t n = 0, largest = out.numel();
    auto flush = [&] {
      if (n > 0)
        with_index_type(largest, [&]<typename I>(Type<I>) {
          pieces_kernel<I><<<blocks_for(n), kThreads, 0, stream()>>>(n, batch, out.as<U>());
          ENCORE_CUDA_LAUNCHED(Op::StridedCopy);
        });
      batch = CopyPieces{};
      n = 0;
      largest = out.numel();
    };
    for (const StridedPiece& p : args.attr<StridedCopyAttrs>().program->pieces) {
      const BufferView& in = args.in[p.input];
      const int64_t count = p.numel();
      if (count == 0) continue;
      if (p.contiguous_output()) {
        gather(Op::StridedCopy, out.as<U>() + p.out_offset, in.as<U>() + p.in_offset, piece_loop(p),
               count, in.numel());
        continue;
      }
      batch.in[batch.count] = in.as<U>();
      batch.piece[batch.count] = p;
      n += count;
      batch.end[batch.count++] = n;
      largest = std::max(largest, in.numel());
      if (batch.count == kPiecesPerLaunch) flush();
    }
    flush();
  });
}

}  // namespace

ENCORE_REGISTER_CUDA(Op::StridedCopy, &strided_copy_kernel);
ENCORE_REGISTER_CUDA(Op::Permute, &permute_kernel);
ENCORE_REGISTER_CUDA(Op::BroadcastTo, &broadcast_to_kernel);
ENCORE_REGISTER_CUDA(Op::Concat, &concat_kernel);
ENCORE_REGISTER_CUDA(Op::Split, &split_kernel);
ENCORE_REGISTER_CUDA(Op::Slice, &slice_kernel);
ENCORE_REGISTER_CUDA(Op::SliceGrad, &slice_grad_kernel);

}  // namespace encore::kernels::cuda
