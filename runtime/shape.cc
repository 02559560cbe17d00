#include "runtime/shape.h"

#include <algorithm>

#include "runtime/error.h"

namespace encore {

Shape::Shape(std::initializer_list<int64_t> dims)
    : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

std::string sizes_text(std::span<const int64_t> dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += cat(i ? "," : "", dims[i]);
  return out + "]";
}

namespace {

// Throws, naming the sizes, unless each is non-negative and their product fits kMaxNumel.
void check_sizes(std::span<const int64_t> dims) {
  for (size_t i = 0; i < dims.size(); ++i)
    ENCORE_CHECK(dims[i] >= 0, "Shape ", sizes_text(dims), ": dimension ", i, " is negative");
  // A zero size leaves no elements, but the strides of the others must still fit: their product
  // is checked, in whatever order the zeros come.
  const bool empty = std::find(dims.begin(), dims.end(), 0) != dims.end();
  int64_t n = 1;
  for (const int64_t d : dims)
    ENCORE_CHECK(
        d == 0 || (!__builtin_mul_overflow(n, d, &n) && n <= Shape::kMaxNumel), "Shape ",
        sizes_text(dims),
        empty ? ": its nonzero sizes multiply to more than 2^59" : ": more than 2^59 elements");
}

}  // namespace

Shape::Shape(std::span<const int64_t> dims) {
  ENCORE_CHECK(dims.size() <= kMaxRank, "Shape ", sizes_text(dims), ": rank ", dims.size(),
               " exceeds the maximum of ", kMaxRank);
  check_sizes(dims);
  std::copy(dims.begin(), dims.end(), dims_.begin());
  rank_ = static_cast<int8_t>(dims.size());
}

void Shape::push_back(int64_t d) {
  ENCORE_CHECK(rank_ < kMaxRank, "Shape ", str(), ": appending ", d,
               " exceeds the maximum rank of ", kMaxRank);
  std::array<int64_t, kMaxRank> next = dims_;
  next[rank_] = d;
  check_sizes({next.data(), static_cast<size_t>(rank_) + 1});
  dims_[rank_++] = d;
}

void Shape::set(int i, int64_t d) {
  ENCORE_CHECK(i >= 0 && i < rank_, "Shape ", str(), ": dimension ", i, " is out of range");
  std::array<int64_t, kMaxRank> next = dims_;
  next[i] = d;
  check_sizes({next.data(), static_cast<size_t>(rank_)});
  dims_[i] = d;
}

int64_t Shape::at(int i, const char* what) const {
  ENCORE_CHECK(i >= -rank_ && i < rank_, what, ": axis ", i, " is out of range for ", str());
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

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op, const char* a_name,
                       const char* b_name) {
  const int r = std::max(a.rank(), b.rank());
  int64_t dims[Shape::kMaxRank];
  for (int i = 0; i < r; ++i) {
    const int ia = a.rank() - r + i, ib = b.rank() - r + i;
    const int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    ENCORE_CHECK(da == db || da == 1 || db == 1, op, ": shapes do not broadcast: ", a_name, " is ",
                 a, ", ", b_name, " is ", b);
    dims[i] = da == 1 ? db : da;
  }
  return Shape(std::span<const int64_t>(dims, r));
}

}  // namespace encore
