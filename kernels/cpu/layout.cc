// Layout kernels: permute, broadcast_to, concat, slice, slice_grad, and the planner's
// strided_copy. They move elements without looking at them, so they run on unsigned integers of
// the dtype's size.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/kernel.h"
#include "kernels/strided_loop.h"

namespace encore::kernels::cpu {
namespace {

// out [rows, cols] = in^T, where in's rows hold `in_stride` elements: 8x8 micro-tiles (kept in
// registers) inside 64x64 blocks (kept in cache).
template <typename U>
void transpose_2d(U* out, const U* in, int64_t rows, int64_t cols, int64_t in_stride) {
  constexpr int64_t kBlock = 64, kMicro = 8;
  for (int64_t i0 = 0; i0 < rows; i0 += kBlock) {
    const int64_t i1 = std::min(i0 + kBlock, rows);
    for (int64_t j0 = 0; j0 < cols; j0 += kBlock) {
      const int64_t j1 = std::min(j0 + kBlock, cols);
      int64_t i = i0;
      for (; i + kMicro <= i1; i += kMicro) {
        int64_t j = j0;
        for (; j + kMicro <= j1; j += kMicro)
          for (int64_t a = 0; a < kMicro; ++a)
            for (int64_t b = 0; b < kMicro; ++b)
              out[(i + a) * cols + j + b] = in[(j + b) * in_stride + i + a];
        for (; j < j1; ++j)
          for (int64_t a = 0; a < kMicro; ++a) out[(i + a) * cols + j] = in[j * in_stride + i + a];
      }
      for (; i < i1; ++i)
        for (int64_t j = j0; j < j1; ++j) out[i * cols + j] = in[j * in_stride + i];
    }
  }
}

// out (contiguous, operand 0 of `loop`) = in read with the strides of operand 1.
template <typename U>
void gather(U* out, const U* in, const StridedLoop<2>& loop) {
  const int r = loop.rank;
  // The last two dimensions swapped (a transpose, possibly batched): tile them.
  if (r >= 2 && loop.strides[1][r - 1] != 1 && loop.strides[1][r - 2] == 1 &&
      loop.dims[r - 1] >= 8 && loop.dims[r - 2] >= 8) {
    StridedLoop<2> outer;
    outer.rank = r - 1;
    for (int d = 0; d < r - 2; ++d) {
      outer.dims[d] = loop.dims[d];
      for (int k = 0; k < 2; ++k) outer.strides[k][d] = loop.strides[k][d];
    }
    outer.dims[r - 2] = 1;
    const int64_t rows = loop.dims[r - 2], cols = loop.dims[r - 1];
    const int64_t in_stride = loop.strides[1][r - 1];
    for_each_row(outer, [&](const int64_t* off, int64_t, const int64_t*) {
      transpose_2d(out + off[0], in + off[1], rows, cols, in_stride);
    });
    return;
  }
  for_each_row(loop, [&](const int64_t* off, int64_t n, const int64_t* s) {
    U* o = out + off[0];
    const U* x = in + off[1];
    if (s[1] == 1) {
      std::memcpy(o, x, n * sizeof(U));
    } else if (s[1] == 0) {
      std::fill(o, o + n, *x);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i] = x[i * s[1]];
    }
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
  switch_itemsize(x.dtype, Op::Permute,
                  [&]<typename U>(Type<U>) { gather(out.as<U>(), x.as<U>(), loop); });
}

void broadcast_to_kernel(const KernelArgs& args) {
  const BufferView &x = args.in[0], &out = args.out[0];
  const StridedLoop<2> loop = broadcast_loop<2>(out.shape, {&x.shape});
  switch_itemsize(x.dtype, Op::BroadcastTo,
                  [&]<typename U>(Type<U>) { gather(out.as<U>(), x.as<U>(), loop); });
}

// Concat (kToWhole: each part into its columns of the whole) or Split (the whole's columns into
// each part): the parts lie side by side along the axis, in order.
template <bool kToWhole>
void concat_or_split(const BufferView& whole, std::span<const BufferView> parts, int axis) {
  const AxisSplit split = split_at(whole.shape, axis);
  const size_t item = itemsize(whole.dtype);
  const size_t whole_row = whole.shape[axis] * split.inner * item;
  char* pw = static_cast<char*>(whole.data);
  size_t column = 0;  // bytes into each whole row where the current part goes
  for (const BufferView& x : parts) {
    const size_t row = x.shape[axis] * split.inner * item;
    char* px = static_cast<char*>(x.data);
    if (row != 0)
      for (int64_t o = 0; o < split.outer; ++o) {
        if constexpr (kToWhole)
          std::memcpy(pw + o * whole_row + column, px + o * row, row);
        else
          std::memcpy(px + o * row, pw + o * whole_row + column, row);
      }
    column += row;
  }
}

void concat_kernel(const KernelArgs& args) {
  concat_or_split<true>(args.out[0], args.in, args.attr<AxisAttrs>().axis);
}

void split_kernel(const KernelArgs& args) {
  concat_or_split<false>(args.in[0], args.out, args.attr<AxisAttrs>().axis);
}

// Pairs x[..., start + k*step, ...] with y[..., k, ...] for k < count: calls
// copy(x_ptr, y_ptr, n) on each run of n adjacent elements.
template <typename X, typename Y, typename Copy>
void walk_slice(X* x, Y* y, const Shape& x_shape, const SliceAttrs& attrs, int64_t count,
                Copy copy) {
  const AxisSplit split = split_at(x_shape, attrs.axis);
  const int64_t dim = split.n, inner = split.inner;
  for (int64_t o = 0; o < split.outer; ++o) {
    X* xo = x + (o * dim + attrs.start) * inner;
    Y* yo = y + o * count * inner;
    if (attrs.step == 1) {
      copy(xo, yo, count * inner);
    } else {
      for (int64_t k = 0; k < count; ++k) copy(xo + k * attrs.step * inner, yo + k * inner, inner);
    }
  }
}

void slice_kernel(const KernelArgs& args) {
  const BufferView &x = args.in[0], &y = args.out[0];
  const SliceAttrs& attrs = args.attr<SliceAttrs>();
  switch_itemsize(x.dtype, Op::Slice, [&]<typename U>(Type<U>) {
    walk_slice(x.as<U>(), y.as<U>(), x.shape, attrs, y.shape[attrs.axis],
               [](const U* from, U* to, int64_t n) {
                 for (int64_t i = 0; i < n; ++i) to[i] = from[i];
               });
  });
}

// gx (the shape of the sliced x) = 0 except gx[..., start + k*step, ...] = gy[..., k, ...].
void slice_grad_kernel(const KernelArgs& args) {
  const BufferView &gy = args.in[0], &gx = args.out[0];
  const SliceAttrs& attrs = args.attr<SliceAttrs>();
  switch_floating(gx.dtype, Op::SliceGrad, [&]<typename T>(Type<T>) {
    T* px = gx.as<T>();
    std::fill(px, px + gx.numel(), T(0));
    walk_slice(px, gy.as<T>(), gx.shape, attrs, gy.shape[attrs.axis],
               [](T* to, const T* from, int64_t n) {
                 for (int64_t i = 0; i < n; ++i) to[i] = from[i];
               });
  });
}

// Each piece of the program (runtime/strided_copy.h): a gather where it writes its part of the
// output contiguously (a transpose tiled as permute's), else row by row.
void strided_copy_kernel(const KernelArgs& args) {
  switch_itemsize(args.out[0].dtype, Op::StridedCopy, [&]<typename U>(Type<U>) {
    for (const StridedPiece& p : args.attr<StridedCopyAttrs>().program->pieces) {
      const StridedLoop<2> loop = piece_loop(p);
      U* to = args.out[p.output].as<U>() + p.out_offset;
      const U* from = args.in[p.input].as<U>() + p.in_offset;
      if (p.contiguous_output()) {
        gather(to, from, loop);
        continue;
      }
      for_each_row(loop, [&](const int64_t* off, int64_t n, const int64_t* s) {
        U* o = to + off[0];
        const U* x = from + off[1];
        if (s[0] == 1 && s[1] == 1) {
          std::memcpy(o, x, n * sizeof(U));
        } else {
          for (int64_t i = 0; i < n; ++i) o[i * s[0]] = x[i * s[1]];
        }
      });
    }
  });
}

[[maybe_unused]] const bool kRegistered = [] {
  register_kernel(Op::StridedCopy, DeviceType::CPU, &strided_copy_kernel);
  register_kernel(Op::Permute, DeviceType::CPU, &permute_kernel);
  register_kernel(Op::BroadcastTo, DeviceType::CPU, &broadcast_to_kernel);
  register_kernel(Op::Concat, DeviceType::CPU, &concat_kernel);
  register_kernel(Op::Split, DeviceType::CPU, &split_kernel);
  register_kernel(Op::Slice, DeviceType::CPU, &slice_kernel);
  register_kernel(Op::SliceGrad, DeviceType::CPU, &slice_grad_kernel);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cpu
