// Reductions over an axis set: sum, mean, max.
//
// Each output element combines its terms as a cascade (reduce_contiguous within a contiguous
// run, Cascade across runs and rows), so a float32 sum over millions of terms on any axis keeps
// its accuracy, and the order of the terms depends on the shapes alone. After coalescing, the
// innermost axis is either reduced (one contiguous run per output element, reduced with
// independent lanes) or kept (columns of the output: a chunk of them is accumulated down the
// reduced rows at once, which vectorizes).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/reduce.h"

#include "kernels/cpu/kernel.h"
#include "kernels/cpu/reduce_row.h"
#include "kernels/strided_loop.h"

namespace encore::kernels::cpu {
namespace {

// Combines a sequence of items, each `width` (at most W) values, as a cascade: kBlock items in
// order into a block, then blocks pairwise as a binary counter (two partials of equal weight
// combine as soon as both exist). A float sum's rounding error then grows with kBlock plus the
// log of the block count instead of with the item count.
template <typename R, typename T, int W>
class Cascade {
 public:
  explicit Cascade(int width) : width_(width) { std::fill(block_, block_ + W, init()); }

  void add(const T* v) {
    for (int j = 0; j < width_; ++j) block_[j] = R::combine(block_[j], v[j]);
    if (++in_block_ == kBlock) carry();
  }

  // The combination of every item added (init when none), into out[0, width).
  void finish(T* out) {
    if (in_block_ > 0) carry();
    std::fill(out, out + width_, init());
    for (int l = 0; l < kLevels; ++l)
      if (blocks_ >> l & 1)
        for (int j = 0; j < width_; ++j) out[j] = R::combine(level_[l][j], out[j]);
  }

 private:
  static constexpr int kBlock = 128;
  static constexpr int kLevels = 64;  // one per bit of the block count
  static constexpr T init() { return R::template init<T>(); }

  // Moves the block up the levels, combining it with each full level it meets.
  void carry() {
    int l = 0;
    for (; blocks_ >> l & 1; ++l)
      for (int j = 0; j < width_; ++j) block_[j] = R::combine(level_[l][j], block_[j]);
    std::copy(block_, block_ + width_, level_[l]);
    ++blocks_;
    in_block_ = 0;
    std::fill(block_, block_ + W, init());
  }

  int width_;
  int in_block_ = 0;
  uint64_t blocks_ = 0;
  T block_[W];
  T level_[kLevels][W];
};

// Calls fn(offsets) for every element of `loop`, in row-major order.
template <int N, typename Fn>
void for_each_element(const StridedLoop<N>& loop, Fn&& fn) {
  for_each_row(loop, [&](const int64_t* off, int64_t n, const int64_t* st) {
    int64_t o[N];
    for (int k = 0; k < N; ++k) o[k] = off[k];
    for (int64_t i = 0; i < n; ++i) {
      fn(static_cast<const int64_t*>(o));
      for (int k = 0; k < N; ++k) o[k] += st[k];
    }
  });
}

template <typename R, typename T>
void reduce(const BufferView& x, const BufferView& out, uint8_t mask) {
  const T* px = x.as<T>();
  T* po = out.as<T>();
  const Shape& shape = x.shape;
  if (x.numel() == 0) {
    std::fill(po, po + out.numel(), R::template init<T>());
    return;
  }
  int64_t strides[2][kMaxRank];  // 0: out, 1: x
  contiguous_strides(shape, strides[1]);
  int64_t s = 1;
  for (int d = shape.rank() - 1; d >= 0; --d) {
    const bool reduced = (mask >> d & 1) != 0;
    strides[0][d] = reduced ? 0 : s;
    if (!reduced) s *= shape[d];
  }
  // Coalesced, the innermost axis has x stride 1 (x is contiguous), and out stride 1 when kept.
  const StridedLoop<2> loop = make_strided_loop<2>(shape.rank(), shape.begin(), strides);
  const int inner = loop.rank - 1;
  const int64_t n = loop.dims[inner];
  const bool inner_reduced = loop.strides[0][inner] == 0;
  // The outer axes split into kept ones (out and x offsets) and reduced ones (x offsets).
  int64_t kept_dims[kMaxRank], kept_strides[2][kMaxRank], red_dims[kMaxRank],
      red_strides[1][kMaxRank];
  int kept_rank = 0, red_rank = 0;
  for (int d = 0; d < inner; ++d) {
    if (loop.strides[0][d] == 0) {
      red_dims[red_rank] = loop.dims[d];
      red_strides[0][red_rank++] = loop.strides[1][d];
    } else {
      kept_dims[kept_rank] = loop.dims[d];
      kept_strides[0][kept_rank] = loop.strides[0][d];
      kept_strides[1][kept_rank++] = loop.strides[1][d];
    }
  }
  const StridedLoop<2> kept = make_strided_loop<2>(kept_rank, kept_dims, kept_strides);
  const StridedLoop<1> rows = make_strided_loop<1>(red_rank, red_dims, red_strides);

  for_each_element(kept, [&](const int64_t* off) {
    const T* in = px + off[1];
    T* o = po + off[0];
    if (inner_reduced) {  // one contiguous run of n terms per reduced row
      Cascade<R, T, 1> c(1);
      for_each_element(rows, [&](const int64_t* r) {
        const T v = reduce_contiguous<R>(in + r[0], n);
        c.add(&v);
      });
      c.finish(o);
    } else {  // n output columns, in chunks accumulated down the reduced rows
      constexpr int kChunk = 128 / sizeof(T);
      for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
        Cascade<R, T, kChunk> c(static_cast<int>(std::min<int64_t>(kChunk, n - c0)));
        for_each_element(rows, [&](const int64_t* r) { c.add(in + r[0] + c0); });
        c.finish(o + c0);
      }
    }
  });
}

// Number of input elements folded into each output element.
int64_t reduced_count(const Shape& shape, uint8_t mask) {
  int64_t c = 1;
  for (int d = 0; d < shape.rank(); ++d)
    if (mask >> d & 1) c *= shape[d];
  return c;
}

template <Op kOp, typename R>
void reduce_kernel(const KernelArgs& args) {
  const BufferView &x = args.in[0], &out = args.out[0];
  const uint8_t mask = args.attr<ReduceAttrs>().axes_mask;
  auto run = [&]<typename T>(Type<T>) {
    if (out.numel() == x.numel()) {  // nothing folded (mask 0, or only size-1 axes)
      std::memcpy(out.data, x.data, x.numel() * sizeof(T));
      return;
    }
    const int rank = x.shape.rank();
    if (rank > 0 && mask == 1u << (rank - 1)) {  // the last axis: rows, as the fused kernel
      const int64_t n = x.shape[rank - 1], rows = out.numel();
      const T* px = x.as<T>();
      T* po = out.as<T>();
      for (int64_t r = 0; r < rows; ++r) po[r] = reduce_last_axis_row<R>(px + r * n, n, rows == 1);
    } else if (out.numel() == 1) {  // every axis folded
      *out.as<T>() = reduce_contiguous<R>(x.as<T>(), x.numel());
    } else {
      reduce<R, T>(x, out, mask);
    }
    if constexpr (kOp == Op::Mean) {
      const T count = static_cast<T>(reduced_count(x.shape, mask));
      T* po = out.as<T>();
      for (int64_t i = 0, n = out.numel(); i < n; ++i) po[i] /= count;
    }
  };
  if constexpr (kOp == Op::Mean) {
    switch_floating(x.dtype, kOp, run);
  } else {
    switch_numeric(x.dtype, kOp, run);
  }
}

}  // namespace

void sum_kernel(const KernelArgs& args) {
  reduce_kernel<Op::Sum, SumOp>(args);
}

namespace {

[[maybe_unused]] const bool kRegistered = [] {
  register_kernel(Op::Sum, DeviceType::CPU, &sum_kernel);
  register_kernel(Op::Mean, DeviceType::CPU, &reduce_kernel<Op::Mean, SumOp>);
  register_kernel(Op::Max, DeviceType::CPU, &reduce_kernel<Op::Max, MaxOp>);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cpu
