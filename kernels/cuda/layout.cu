// The layout CUDA kernels (the same semantics as kernels/cpu/layout.cc); the kernels, their launch
// plans and how they work are in layout.cuh.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/layout.cuh"
#include "kernels/strided_loop.h"

namespace encore::kernels::cuda {
namespace {

// out (contiguous, operand 0 of `loop`, n elements) = in read with the strides of operand 1,
// whose offsets stay below in_numel.
template <typename U>
void gather(Op op, U* out, const U* in, const StridedLoop<2>& loop, int64_t n, int64_t in_numel) {
  if (n == 0) return;
  const GatherPlan plan = plan_gather(loop);
  switch (plan.kind) {
    case GatherPlan::kCopy:
      ENCORE_CUDA_OK(op,
                     cudaMemcpyAsync(out, in, n * sizeof(U), cudaMemcpyDeviceToDevice, stream()));
      return;
    case GatherPlan::kTiles:
      transpose_kernel<<<dim3(plan.grid[0], plan.grid[1], plan.grid[2]), dim3(kTile, kTileRows), 0,
                         stream()>>>(plan.batches, plan.batch, plan.rows, plan.cols, plan.in_stride,
                                     out, in);
      ENCORE_CUDA_LAUNCHED(op);
      return;
    case GatherPlan::kGeneral:
      with_index_type(std::max(n, in_numel), [&]<typename I>(Type<I>) {
        gather_kernel<I><<<blocks_for(n), kThreads, 0, stream()>>>(n, plan.g, out, in);
        ENCORE_CUDA_LAUNCHED(op);
      });
  }
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

void strided_copy_kernel(const KernelArgs& args) {
  switch_itemsize(args.out[0].dtype, Op::StridedCopy, [&]<typename U>(Type<U>) {
    for_each_copy_launch(
        args.attr<StridedCopyAttrs>().program->pieces, args.in, args.out,
        [&](const StridedPiece& p, const BufferView& in, const BufferView& out) {
          gather(Op::StridedCopy, out.as<U>() + p.out_offset, in.as<U>() + p.in_offset,
                 piece_loop(p), p.numel(), in.numel());
        },
        [&](const CopyPieces& batch, int64_t n, int64_t largest) {
          with_index_type(largest, [&]<typename I>(Type<I>) {
            pieces_kernel<I, U><<<blocks_for(n), kThreads, 0, stream()>>>(n, batch);
            ENCORE_CUDA_LAUNCHED(Op::StridedCopy);
          });
        });
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
