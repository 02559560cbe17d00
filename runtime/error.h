// encore::Error and the argument-checking helpers every routine uses.
//
//   ENCORE_CHECK(a.rank() == 2, "matmul: a must be 2-D, a is ", a.shape());
//
// Messages name the op, the argument and the shapes so a user can act on them.
#pragma once

#include <concepts>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace encore {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename T>
void append_part(std::string& out, const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    out += v ? "true" : "false";
  } else if constexpr (std::is_arithmetic_v<T>) {
    absl::StrAppend(&out, v);
  } else if constexpr (std::is_enum_v<T>) {
    out += name(v);  // DType
  } else if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    out += std::string_view(v);
  } else {
    out += v.str();  // Shape, Device, Tensor
  }
}
}  // namespace detail

// The concatenation of `parts`: strings, numbers, and anything with a str() member.
template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::string out;
  (detail::append_part(out, parts), ...);
  return out;
}

// Throws Error with the concatenation of `parts`.
template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  throw Error(cat(parts...));
}

}  // namespace encore

#define ENCORE_CHECK(cond, ...)    \
  do {                             \
    if (!(cond)) [[unlikely]]      \
      ::encore::fail(__VA_ARGS__); \
  } while (0)
