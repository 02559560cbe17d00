// Shape: up to kMaxRank dimensions stored inline (no heap allocation).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

namespace encore {

class Shape {
 public:
  static constexpr int kMaxRank = 8;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);

  int rank() const { return rank_; }
  // Largest element count of a tensor (so that byte sizes never overflow).
  static constexpr int64_t kMaxNumel = int64_t{1} << 59;

  int64_t operator[](int i) const { return dims_[i]; }
  // Sets dimension i; throws Error for a negative size or an element count over kMaxNumel.
  void set(int i, int64_t d);
  // Dimension with Python-style negative indexing; throws Error naming `what` (the caller)
  // when out of range.
  int64_t at(int i, const char* what = "Shape::at") const;
  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + rank_; }
  std::span<const int64_t> dims() const { return {dims_.data(), static_cast<size_t>(rank_)}; }

  // Appends a dimension; throws Error for a negative size, rank > kMaxRank or an element count
  // over kMaxNumel.
  void push_back(int64_t d);
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[i];
    return n;
  }
  // Row-major strides in elements.
  std::array<int64_t, kMaxRank> strides() const;

  bool operator==(const Shape& o) const {
    if (rank_ != o.rank_) return false;
    for (int i = 0; i < rank_; ++i)
      if (dims_[i] != o.dims_[i]) return false;
    return true;
  }

  std::string str() const;  // "[32,784]"

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int8_t rank_ = 0;
};

// "[2,-3]", as Shape::str() writes a shape: sizes that may not make one (for error messages).
std::string sizes_text(std::span<const int64_t> dims);

// Resolves a possibly negative axis against `rank`; throws naming `op` when out of range.
int normalize_axis(int axis, int rank, const char* op);

// The broadcast of two shapes (NumPy rules); throws naming `op` and both shapes when they
// do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op, const char* a_name = "a",
                       const char* b_name = "b");

}  // namespace encore
