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

namespace {
// Throws unless the product of `dims` fits kMaxNumel.
void check_numel(const int64_t* dims, int rank) {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) {
    ENCORE_CHECK(!__builtin_mul_overflow(n, dims[i], &n) && n <= Shape::kMaxNumel,
                 "Shape: too many elements (more than 2^59) in a shape with dimension ", dims[i]);
  }
}
}  // namespace

void Shape::push_back(int64_t d) {
  ENCORE_CHECK(rank_ < kMaxRank, "Shape: rank exceeds the maximum of ", kMaxRank);
  ENCORE_CHECK(d >= 0, "Shape: negative dimension ", d);
  dims_[rank_++] = d;
  check_numel(dims_.data(), rank_);
}

void Shape::set(int i, int64_t d) {
  ENCORE_CHECK(i >= 0 && i < rank_, "Shape: dimension ", i, " is out of range for rank ", rank_);
  ENCORE_CHECK(d >= 0, "Shape: negative dimension ", d);
  dims_[i] = d;
  check_numel(dims_.data(), rank_);
}

int64_t Shape::at(int i) const {
  ENCORE_CHECK(i >= -rank_ && i < rank_, "Shape: axis ", i, " is out of range for ", str());
  return dims_[i < 0 ? i + rank_ : i];
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
