// Strided iteration over several operands at once: the machinery behind broadcasting binary
// ops, where, broadcast_to, permute and strided reductions.
//
//   StridedLoop<3> loop = broadcast_loop<3>(out.shape, {&a.shape, &b.shape});
//   for_each_row(loop, [&](const int64_t* off, int64_t n, const int64_t* stride) {
//     // operand k's row starts at element off[k] and advances by stride[k]; n elements
//   });
//
// Operand 0 is conventionally the output. Building a loop drops size-1 dimensions and merges
// adjacent dimensions that every operand walks contiguously, so [N,C] + [C] runs as N rows of
// stride pattern (1, 1, 0) and same-shape operands run as one row.
//
// Host code for every backend: cpu kernels run for_each_row, cuda kernels build a loop on the host
// and hand its dimensions and strides to a device kernel. split_at is the [outer, n, inner] view
// of a shape around one axis (softmax lanes, concat, slice) on both.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "runtime/shape.h"
#include "runtime/strided_copy.h"

namespace encore::kernels {

inline constexpr int kMaxRank = Shape::kMaxRank;

template <int N>
struct StridedLoop {
  int rank = 1;  // at least 1
  int64_t dims[kMaxRank] = {1};
  int64_t strides[N][kMaxRank] = {};
  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= dims[d];
    return n;
  }
};

// Element strides with which `in` is read when broadcast to `out` (right-aligned; 0 on
// broadcast dimensions), one per dimension of `out`.
inline void broadcast_strides(const Shape& in, const Shape& out, int64_t* strides) {
  const int shift = out.rank() - in.rank();
  int64_t s = 1;
  for (int d = out.rank() - 1; d >= 0; --d) {
    const int di = d - shift;
    if (di < 0 || in[di] == 1) {
      strides[d] = 0;
    } else {
      strides[d] = s;
      s *= in[di];
    }
  }
}

// Row-major strides of `shape`.
inline void contiguous_strides(const Shape& shape, int64_t* strides) {
  int64_t s = 1;
  for (int d = shape.rank() - 1; d >= 0; --d) {
    strides[d] = s;
    s *= shape[d];
  }
}

// A shape seen as [outer, n, inner] around one axis (softmax lanes, concat, slice).
struct AxisSplit {
  int64_t outer = 1, n = 1, inner = 1;
};
inline AxisSplit split_at(const Shape& shape, int axis) {
  AxisSplit s;
  for (int d = 0; d < axis; ++d) s.outer *= shape[d];
  s.n = shape[axis];
  for (int d = axis + 1; d < shape.rank(); ++d) s.inner *= shape[d];
  return s;
}

// A loop over `rank` dimensions `dims` where operand k has element strides strides[k][d];
// drops size-1 dimensions and merges dimensions that every operand walks contiguously.
template <int N>
StridedLoop<N> make_strided_loop(int rank, const int64_t* dims,
                                 const int64_t (&strides)[N][kMaxRank]) {
  StridedLoop<N> loop;
  int r = 0;
  for (int d = 0; d < rank; ++d) {
    if (dims[d] == 1) continue;
    bool merge = r > 0;
    for (int k = 0; k < N && merge; ++k) merge = loop.strides[k][r - 1] == strides[k][d] * dims[d];
    if (merge) {
      loop.dims[r - 1] *= dims[d];
      for (int k = 0; k < N; ++k) loop.strides[k][r - 1] = strides[k][d];
    } else {
      loop.dims[r] = dims[d];
      for (int k = 0; k < N; ++k) loop.strides[k][r] = strides[k][d];
      ++r;
    }
  }
  if (r == 0) {  // a single element
    loop.dims[0] = 1;
    for (int k = 0; k < N; ++k) loop.strides[k][0] = 0;
    r = 1;
  }
  loop.rank = r;
  return loop;
}

// A strided-copy piece (runtime/strided_copy.h, its dimensions merged when planned) as a loop:
// operand 0 its output, operand 1 its input.
inline StridedLoop<2> piece_loop(const StridedPiece& p) {
  StridedLoop<2> loop;
  loop.rank = p.rank;
  for (int d = 0; d < p.rank; ++d) {
    loop.dims[d] = p.dims[d];
    loop.strides[0][d] = p.out_strides[d];
    loop.strides[1][d] = p.in_strides[d];
  }
  return loop;
}

// A loop over `out` (operand 0, contiguous) and N-1 inputs broadcast to it.
template <int N>
StridedLoop<N> broadcast_loop(const Shape& out, std::initializer_list<const Shape*> inputs) {
  int64_t strides[N][kMaxRank];
  contiguous_strides(out, strides[0]);
  int k = 1;
  for (const Shape* in : inputs) broadcast_strides(*in, out, strides[k++]);
  return make_strided_loop<N>(out.rank(), out.begin(), strides);
}

// Calls body(off, n, stride) once per innermost row: operand k's row starts at element
// offset off[k] and steps by stride[k] for n elements. No division per element or row.
template <int N, typename Body>
void for_each_row(const StridedLoop<N>& loop, Body&& body) {
  const int r = loop.rank;
  const int64_t n = loop.dims[r - 1];
  int64_t stride[N];
  for (int k = 0; k < N; ++k) stride[k] = loop.strides[k][r - 1];
  int64_t rows = 1;
  for (int d = 0; d < r - 1; ++d) rows *= loop.dims[d];
  if (rows == 0 || n == 0) return;
  int64_t off[N] = {};
  int64_t idx[kMaxRank] = {};
  for (int64_t row = 0; row < rows; ++row) {
    body(static_cast<const int64_t*>(off), n, static_cast<const int64_t*>(stride));
    for (int d = r - 2; d >= 0; --d) {
      for (int k = 0; k < N; ++k) off[k] += loop.strides[k][d];
      if (++idx[d] < loop.dims[d]) break;
      for (int k = 0; k < N; ++k) off[k] -= loop.strides[k][d] * loop.dims[d];
      idx[d] = 0;
    }
  }
}

}  // namespace encore::kernels
