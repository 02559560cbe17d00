// The pooling kernels (kernels/cuda/pool.cuh) run on the host (emulated_kernel.h) on pool.cu's
// grids, against the CPU's pooling through the public API: they claim the CPU's bits, forward and
// backward, so the test compares bits. Windows overlapping and apart, clipped by padding, with
// and without the padded zeros in the divisor, over planes that leave the last block partly idle;
// max pooling over ties and NaNs (the first maximum takes the gradient). The [cuda] tests check
// the device against the CPU.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "encore/encore.h"
#include "kernels/pool_geometry.h"
#include "tests/nvrtc/emulated_kernel.h"

using namespace encore;

namespace {

constexpr const char* kSource = R"cuda(
#include "kernels/cuda/grid.h"
#include "kernels/cuda/pool.cuh"
using namespace encore::kernels::cuda;
using encore::kernels::PoolGeometry;
// pool.cu's launches: y from x (forward) or gx from x and gy (gradient), n output elements.
template <typename T>
void pool(bool max, bool grad, const T* x, const T* gy, T* out, const PoolGeometry* g,
          long long n) {
  emulate_launch(blocks_for(n), kThreads, [&] {
    if (max && !grad) max_pool_kernel<T>(x, out, *g, n);
    if (!max && !grad) avg_pool_kernel<T>(x, out, *g, n);
    if (max && grad) max_pool_grad_kernel<T>(x, gy, out, *g, n);
    if (!max && grad) avg_pool_grad_kernel<T>(gy, out, *g, n);
  });
}
extern "C" void pool_f32(bool max, bool grad, const float* x, const float* gy, float* out,
                         const PoolGeometry* g, long long n) {
  pool<float>(max, grad, x, gy, out, g, n);
}
extern "C" void pool_f64(bool max, bool grad, const double* x, const double* gy, double* out,
                         const PoolGeometry* g, long long n) {
  pool<double>(max, grad, x, gy, out, g, n);
}
)cuda";

template <typename T>
using Pool = void (*)(bool, bool, const T*, const T*, T*, const kernels::PoolGeometry*, long long);

template <typename T>
Pool<T> pool_entry() {
  static const testing::HostObject object({}, kSource);
  return object.function<Pool<T>>(testing::typed_name<T>("pool"));
}

// A cpu tensor holding `v`'s bits (NaNs with their payloads).
template <typename T>
Tensor exactly(const std::vector<T>& v, const Shape& shape, DType dtype) {
  Tensor t = zeros(shape, dtype);
  std::memcpy(t.raw_data(), v.data(), v.size() * sizeof(T));
  return t;
}

struct Case {
  int64_t n, c, h, w;
  int kernel[2], stride[2], padding[2];
};

template <typename T>
void check_pool(const Case& k, bool max, bool count_include_pad, std::mt19937& rng) {
  INFO((max ? "max" : "average") << " pooling of [" << k.n << ", " << k.c << ", " << k.h << ", "
                                 << k.w << "], kernel " << k.kernel[0] << "x" << k.kernel[1]
                                 << ", stride " << k.stride[0] << "x" << k.stride[1] << ", padding "
                                 << k.padding[0] << "x" << k.padding[1]
                                 << (count_include_pad ? "" : ", padding not counted") << ", "
                                 << sizeof(T) * 8 << "-bit");
  const DType dtype = sizeof(T) == 4 ? DType::Float32 : DType::Float64;
  // Few distinct values (ties in most windows) and some NaNs for max pooling.
  std::uniform_int_distribution<int> level(-3, 3), pick(0, 40);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<T> xv(static_cast<size_t>(k.n * k.c * k.h * k.w));
  for (T& v : xv)
    v = max ? (pick(rng) == 0 ? std::numeric_limits<T>::quiet_NaN() : static_cast<T>(level(rng)))
            : static_cast<T>(u(rng));
  const Tensor x = exactly(xv, Shape{k.n, k.c, k.h, k.w}, dtype).set_requires_grad();
  const Size2 kernel{k.kernel[0], k.kernel[1]}, stride{k.stride[0], k.stride[1]},
      padding{k.padding[0], k.padding[1]};
  const Tensor y = max ? F::max_pool2d(x, kernel, stride, padding)
                       : F::avg_pool2d(x, kernel, stride, padding, count_include_pad);
  std::vector<T> gyv(static_cast<size_t>(y.numel()));
  for (T& v : gyv) v = static_cast<T>(u(rng));
  y.backward(exactly(gyv, y.shape(), dtype));

  Pool2dAttrs attrs;
  for (int d = 0; d < 2; ++d) {
    attrs.kernel[d] = k.kernel[d];
    attrs.stride[d] = k.stride[d];
    attrs.padding[d] = k.padding[d];
  }
  attrs.count_include_pad = count_include_pad;
  const kernels::PoolGeometry g = kernels::pool_geometry(x.shape(), y.shape(), attrs);
  std::vector<T> out(static_cast<size_t>(y.numel())), gx(xv.size());
  pool_entry<T>()(max, false, xv.data(), nullptr, out.data(), &g, y.numel());
  pool_entry<T>()(max, true, xv.data(), gyv.data(), gx.data(), &g, x.numel());
  CHECK(testing::same_bits(out, y.to_vector<T>()));
  CHECK(testing::same_bits(gx, x.grad().to_vector<T>()));
}

}  // namespace

TEST_CASE("max and average pooling and their gradients give the CPU's bits (emulated)",
          "[nvrtc][emulated]") {
  std::mt19937 rng(59);
  const Case cases[] = {
      {2, 3, 9, 11, {3, 3}, {2, 2}, {1, 1}},   // overlapping windows, clipped by the padding
      {1, 2, 8, 8, {2, 2}, {2, 2}, {0, 0}},    // windows apart
      {3, 1, 7, 10, {3, 2}, {1, 3}, {1, 1}},   // a rectangle, strides of their own
      {1, 1, 5, 300, {1, 5}, {1, 4}, {0, 2}},  // over two blocks of 256 threads, the last idle
      {1, 2, 6, 9, {3, 5}, {1, 1}, {1, 2}},    // an element in up to 15 windows: the sums' order
  };
  for (const Case& k : cases)
    for (const bool max : {true, false}) {
      check_pool<float>(k, max, true, rng);
      check_pool<double>(k, max, !max, rng);  // the divisor without the padded zeros
    }
}
