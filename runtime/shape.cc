#include "runtime/shape.h"

#include "runtime/error.h"

namespace encore {

Shape::Shape(std::initializer_list<int64_t> dims)
    : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  ENCORE_CHECK(dims.size() <= kMaxRank, "Shape: rank ", dims.size(), " exceeds the maximum of ",
               kMaxRank);
  for (int64_t d : dims) push_back(d);
}

void Shape::push_back(int64_t d) {
  ENCORE_CHECK(rank_ < kMaxRank, "Shape: rank exceeds the maximum of ", kMaxRank);
  ENCORE_CHECK(d >= 0, "Shape: negative dimension ", d);
  dims_[rank_++] = d;
}

std::array<int64_t, Shape::kMaxRank> Shape::strides() const {
  std::array<int64_t, kMaxRank> s{};
  int64_t acc = 1;
  for (int i = rank_ - 1; i >= 0; --i) {
    s[i] = acc;
    acc *= dims_[i];
  }
  return s;
}

std::string Shape::str() const {
  std::string out = "[";
  for (int i = 0; i < rank_; ++i) out += cat(i ? "," : "", dims_[i]);
  out += "]";
  return out;
}

int normalize_axis(int axis, int rank, const char* op) {
  ENCORE_CHECK(axis >= -rank && axis < rank, op, ": axis ", axis, " is out of range for rank ",
               rank);
  return axis < 0 ? axis + rank : axis;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const int r = std::max(a.rank(), b.rank());
  int64_t dims[Shape::kMaxRank];
  for (int i = 0; i < r; ++i) {
    const int ia = a.rank() - r + i, ib = b.rank() - r + i;
    const int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    ENCORE_CHECK(da == db || da == 1 || db == 1, op, ": shapes do not broadcast: a is ", a,
                 ", b is ", b);
    dims[i] = da == 1 ? db : da;
  }
  return Shape(std::span<const int64_t>(dims, r));
}

}  // namespace encore
