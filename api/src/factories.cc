// Tensor factories and in-place routines.
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>

#include "api/src/routine.h"

namespace encore {

using detail::check_defined;
using detail::check_floating;

Tensor empty(const Shape& shape, DType dtype, Device device) {
  return Tensor::empty(shape, dtype, device);
}

namespace {
// Refuses a value an integer dtype cannot hold (as PyTorch does): a NaN, an infinity, or one
// whose integer part is out of the dtype's range (copy_ would saturate it, silently). The
// fractional part of a value in range is dropped, as in a conversion.
void check_representable(const char* op, double value, DType dtype) {
  if (!is_integral(dtype)) return;
  ENCORE_CHECK(std::isfinite(value), op, ": value ", value, " cannot fill a ", dtype,
               " tensor: a NaN or infinity cannot be an integer");
  const double past_max = dtype == DType::Int32 ? 0x1p31 : 0x1p63;  // exact
  const double t = std::trunc(value);
  if (t >= -past_max && t < past_max) return;
  char digits[32];  // the shortest form that reads back as value (StrCat's rounds to 6 digits)
  const auto end = std::to_chars(digits, digits + sizeof(digits), value).ptr;
  const bool i32 = dtype == DType::Int32;
  fail(op, ": value ", std::string_view(digits, end - digits), " cannot fill a ", dtype,
       " tensor: it is out of the range [", i32 ? INT32_MIN : INT64_MIN, ", ",
       i32 ? INT32_MAX : INT64_MAX, "]");
}
}  // namespace

// A finite value a float32 fill would make infinite is refused too (as PyTorch's fill, full and
// masked_fill do; tensor() converts it to an infinity, as PyTorch's does).
void detail::check_fill_value(const char* op, double value, DType dtype) {
  check_representable(op, value, dtype);
  if (dtype != DType::Float32 || !std::isfinite(value) ||
      std::abs(value) <= std::numeric_limits<float>::max())
    return;
  // Both to the last digit (3.4028235e+38 is beyond 3.4028234663852886e+38).
  char digits[32], limit[32];
  const auto end = std::to_chars(digits, digits + sizeof(digits), value).ptr;
  const auto limit_end = std::to_chars(limit, limit + sizeof(limit),
                                       static_cast<double>(std::numeric_limits<float>::max()))
                             .ptr;
  fail(op, ": value ", std::string_view(digits, end - digits),
       " cannot fill a float32 tensor: it is beyond float32's largest value ",
       std::string_view(limit, limit_end - limit), " (pass a float64 tensor, or an infinity)");
}

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  detail::check_fill_value("full", value, dtype);
  Tensor t = Tensor::empty(shape, dtype, device);
  fill_(t, value);
  return t;
}

Tensor zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}
Tensor ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}
Tensor zeros_like(const Tensor& t) {
  return full_like(t, 0.0);
}
Tensor ones_like(const Tensor& t) {
  return full_like(t, 1.0);
}
Tensor full_like(const Tensor& t, double value) {
  check_defined("full_like", "t", t);
  return full(t.shape(), value, t.dtype(), t.device());
}

Tensor tensor(std::span<const double> values, const Shape& shape, DType dtype, Device device) {
  ENCORE_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), "tensor: ", values.size(),
               " values do not fill shape ", shape, " (", shape.numel(), " elements)");
  for (const double v : values) check_representable("tensor", v, dtype);
  // Copied to the device as float64, then converted there: inside a static function traced on
  // a device the conversion is an op on that device, not a cpu op its schedule cannot run.
  Tensor host = Tensor::empty(shape, DType::Float64);
  std::copy(values.begin(), values.end(), host.data<double>());
  Tensor values_on_device = host.to(device);
  if (dtype == DType::Float64) return values_on_device;
  Tensor converted = Tensor::empty(shape, dtype, device);
  copy_(converted, values_on_device);
  return converted;
}

Tensor tensor(std::initializer_list<double> values, const Shape& shape, DType dtype,
              Device device) {
  return tensor(std::span<const double>(values.begin(), values.size()), shape, dtype, device);
}

Tensor arange(int64_t n, DType dtype, Device device) {
  ENCORE_CHECK(n >= 0, "arange: n must be non-negative, it is ", n);
  // An op, not host values: a static function's trace records it as a step of its own, so a
  // planned size runs it at that size (a causal mask over a dynamic length).
  Tensor t = Tensor::empty({n}, dtype, device);
  dispatch(Op::Arange, {t}, {});
  return t;
}

Tensor rand(const Shape& shape, DType dtype, Device device, double low, double high) {
  Tensor t = Tensor::empty(shape, dtype, device);
  uniform_(t, low, high);
  return t;
}

Tensor randn(const Shape& shape, DType dtype, Device device, double mean, double std) {
  Tensor t = Tensor::empty(shape, dtype, device);
  normal_(t, mean, std);
  return t;
}

Tensor clone(const Tensor& x) {
  check_defined("clone", "x", x);
  return detail::call1(Op::Copy, {x}, x.shape(), x.dtype());
}

void detail::zero_grads(std::span<const Tensor> params, bool set_to_none) {
  NoGradGuard no_grad;
  for (Tensor p : params) {
    if (set_to_none || !p.grad().defined())
      p.set_grad(Tensor());
    else
      fill_(p.grad(), 0.0);
  }
}

void fill_(const Tensor& t, double value) {
  check_defined("fill_", "t", t);
  detail::check_fill_value("fill_", value, t.dtype());
  dispatch(Op::Fill, {t}, {}, AttrBlob::of(ScalarAttrs{value}));
}

namespace {
// The in-place ops are not differentiable: in grad mode, an operand that requires grad would lose
// its gradient where eager PyTorch would carry it (an Error instead of a silent loss).
void not_dropping_grad(const char* op, const char* name, const Tensor& operand, const char* dst,
                       const char* instead) {
  ENCORE_CHECK(!GradMode::enabled() || !operand.requires_grad(), op, ": ", name, " ",
               operand.shape(), " requires grad, and ", op, " is not differentiable (", dst,
               " would not carry its gradient); use ", instead, ", or pass ", name,
               ".detach() (or run it under NoGradGuard) where no gradient should flow");
}
}  // namespace

void add_(const Tensor& t, const Tensor& other) {
  check_floating("add_", "t", t);
  check_floating("add_", "other", other);
  detail::check_same_dtype("add_", t, other);
  ENCORE_CHECK(broadcast_shapes(t.shape(), other.shape(), "add_", "t", "other") == t.shape(),
               "add_: other ", other.shape(), " does not broadcast to t ", t.shape());
  not_dropping_grad("add_", "other", other, "t", "F::add(t, other)");
  dispatch(Op::AddInplace, {t, other}, {});
}

void copy_(const Tensor& dst, const Tensor& src) {
  check_defined("copy_", "dst", dst);
  check_defined("copy_", "src", src);
  ENCORE_CHECK(dst.shape() == src.shape(), "copy_: shapes differ: dst is ", dst.shape(),
               ", src is ", src.shape());
  not_dropping_grad("copy_", "src", src, "dst", "the result of the ops that made src");
  dispatch(Op::CopyInplace, {dst, src}, {});
}

namespace {
void random_fill(Op op, const char* name, const Tensor& t, double a, double b) {
  check_floating(name, "t", t);
  const Generator::Stream s = default_generator(t.device()).reserve(random_count(t.numel()));
  RandomAttrs attrs{a, b, s.seed, s.offset};
  dispatch(op, {t}, {}, AttrBlob::of(attrs));
}
}  // namespace

void uniform_(const Tensor& t, double low, double high) {
  ENCORE_CHECK(low <= high, "uniform_: low ", low, " > high ", high);
  // (As PyTorch: a range whose width, or an end, is not finite in the tensor's dtype is refused;
  // its draws would be inf or NaN.)
  const bool single = t.dtype() == DType::Float32;
  const double width =
      single ? static_cast<double>(static_cast<float>(high) - static_cast<float>(low)) : high - low;
  ENCORE_CHECK(std::isfinite(low) && std::isfinite(high) && std::isfinite(width),
               "uniform_: the range [", low, ", ", high, ") of a ", t.dtype(), " tensor ",
               t.shape(), " has a width that is not finite in ", t.dtype());
  random_fill(Op::UniformInit, "uniform_", t, low, high);
}

void normal_(const Tensor& t, double mean, double std) {
  ENCORE_CHECK(std::isfinite(std) && std >= 0, "normal_: std must be finite and non-negative, got ",
               std);
  random_fill(Op::NormalInit, "normal_", t, mean, std);
}

}  // namespace encore
