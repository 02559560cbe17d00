// The small GEMM kernels (kernels/cuda/small_gemm.cuh) run on the host (emulated_kernel.h: each
// CUDA thread a fiber, the warp's shuffles at barriers) against a reference computed here in
// double: both layouts, over tiles and columns that run past c's edge, operands with row lengths
// longer than their rows or not aligned to 16 bytes, and every way an output is finished (a bias,
// each activation, each activation gradient). A product (and its bias) must have the bits of the
// kernels' order of operations, restated here; nothing past c's outputs may be written; relu
// passes a NaN as element_ops.cuh's relu does. With a stored [k, m], the sums of a's columns (a
// bias gradient) come out with the bits of CUDA's column sum's order, restated here too. The
// [cuda] tests check the device's bits against eager.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "runtime/ops.h"
#include "tests/nvrtc/emulated_kernel.h"

using namespace encore;

namespace {

constexpr const char* kSource = R"cuda(
#include "kernels/cuda/small_gemm.cuh"
using namespace encore::kernels::cuda;
template <typename T>
void launch(bool dot, long long m, long long n, long long k, bool trans_a, const void* a,
            long long lda, const void* b, long long ldb, void* c, long long ldc,
            const void* bias, int act, double scalar, const void* act_in, void* sums) {
  const GemmFinish<T> f{static_cast<const T*>(bias), static_cast<const T*>(act_in),
                        static_cast<encore::Op>(act), static_cast<T>(scalar), static_cast<T*>(sums)};
  const GemmLaunch l = small_gemm_launch(dot, m, n, sums != nullptr);
  const T* pa = static_cast<const T*>(a);
  const T* pb = static_cast<const T*>(b);
  T* pc = static_cast<T*>(c);
  const bool vectors_b = stages_vectors(pb, ldb);
  // With the dynamic shared memory small_gemm.cu gives each launch: a kernel that used more
  // aborts (emulate_launch).
  if (dot) {
    const int chunk = dot_chunk<T>(k);
    emulate_launch(l.blocks, kSmallGemmThreads, dot_shared_bytes<T>(chunk), [&] {
      gemm_dot_kernel<T>(m, n, k, chunk, pa, lda, stages_vectors(pa, lda), pb, ldb, vectors_b, pc,
                         ldc, f);
    });
  } else if (l.rows == 1) {
    const int chunk = serial_chunk<T, 1>(k);
    emulate_launch(l.blocks, kSmallGemmThreads, serial_shared_bytes<T, 1>(chunk), [&] {
      gemm_serial_k_kernel<T, 1>(m, n, k, chunk, trans_a, pa, lda, pb, ldb, vectors_b, pc, ldc, f);
    });
  } else {
    const int chunk = serial_chunk<T, kSerialRows>(k);
    emulate_launch(l.blocks, kSmallGemmThreads, serial_shared_bytes<T, kSerialRows>(chunk), [&] {
      gemm_serial_k_kernel<T, kSerialRows>(m, n, k, chunk, trans_a, pa, lda, pb, ldb, vectors_b, pc,
                                           ldc, f);
    });
  }
}
#define ENTRY(name, T)                                                                        \
  extern "C" void name(bool dot, long long m, long long n, long long k, bool trans_a,          \
                       const void* a, long long lda, const void* b, long long ldb, void* c,   \
                       long long ldc, const void* bias, int act, double scalar,               \
                       const void* act_in, void* sums) {                                      \
    launch<T>(dot, m, n, k, trans_a, a, lda, b, ldb, c, ldc, bias, act, scalar, act_in, sums); \
  }
ENTRY(small_gemm_f32, float)
ENTRY(small_gemm_f64, double)
// The k (1 to three chunks' worth) whose kSerialK launch reserves less than a 16-byte vector past
// a's staged rows, or more than a block may have; 0 where there is none.
template <typename T, int kRows>
long long serial_slack_short() {
  for (long long k = 1; k <= 3 * kSerialMaxChunk<T, kRows>; ++k) {
    const int chunk = serial_chunk<T, kRows>(k);
    const size_t staged = static_cast<size_t>(kSmallGemmThreads + kRows) * chunk * sizeof(T);
    const size_t bytes = serial_shared_bytes<T, kRows>(chunk);
    if (bytes < staged + 16 || bytes > static_cast<size_t>(kMaxDynamicSharedBytes)) return k;
  }
  return 0;
}
extern "C" long long serial_slack_short_f32(int rows) {
  return rows == 1 ? serial_slack_short<float, 1>() : serial_slack_short<float, kSerialRows>();
}
extern "C" long long serial_slack_short_f64(int rows) {
  return rows == 1 ? serial_slack_short<double, 1>() : serial_slack_short<double, kSerialRows>();
}
)cuda";

using Entry = void (*)(bool, long long, long long, long long, bool, const void*, long long,
                       const void*, long long, void*, long long, const void*, int, double,
                       const void*, void*);

const testing::HostObject& gemm_kernels() {
  static const testing::HostObject object({}, kSource);
  return object;
}

// The reference's finish of a product v (double): as element_ops.cuh's functions.
double act_of(Op act, double v, double in, double s) {
  switch (act) {
    case Op::Relu:
      return v <= 0 ? 0 : v;
    case Op::LeakyRelu:
      return v > 0 ? v : s * v;
    case Op::Sigmoid:
      return 1 / (1 + std::exp(-v));
    case Op::Tanh:
      return std::tanh(v);
    case Op::Gelu:
      if (s != 0)
        return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
      return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    case Op::ReluGrad:
      return in <= 0 ? 0 : v;
    case Op::LeakyReluGrad:
      return in > 0 ? v : s * v;
    case Op::SigmoidGrad:
      return v * in * (1 - in);
    case Op::TanhGrad:
      return v * (1 - in * in);
    case Op::GeluGrad: {
      const double cdf = 0.5 * (1 + std::erf(in / std::sqrt(2.0)));
      const double pdf = std::exp(-0.5 * in * in) / std::sqrt(2 * M_PI);
      if (s == 0) return v * (cdf + in * pdf);
      const double u = std::sqrt(2 / M_PI) * (in + 0.044715 * in * in * in);
      const double t = std::tanh(u);
      return v * (0.5 * (1 + t) +
                  0.5 * in * (1 - t * t) * std::sqrt(2 / M_PI) * (1 + 3 * 0.044715 * in * in));
    }
    default:
      return v;
  }
}
bool is_grad(Op act) {
  return act == Op::ReluGrad || act == Op::LeakyReluGrad || act == Op::SigmoidGrad ||
         act == Op::TanhGrad || act == Op::GeluGrad;
}

struct Case {
  bool dot;
  int64_t m, n, k;
  bool trans_a = false;
  int64_t pad = 0;  // extra elements at the end of every row of a, b and c
  bool bias = false;
  Op act = Op::Matmul;
  double scalar = 0;
  bool sums = false;  // serial k with a transposed: a's column sums too
  int64_t offset = 0;  // a and b this many elements into their storage (1: not 16-byte aligned)
};

// Output (i, j) with the kernels' order of operations, in T: kDot's lane l multiplies and adds
// k = l, l + 32, ... in order, then the lanes meet in the butterfly (xor 16, 8, 4, 2, 1; a sum
// does not depend on the order of its two terms, so every lane ends with the same bits);
// kSerialK multiplies and adds k = 0, 1, ... in order. Then a bias. `x(p)` and `y(p)` are the
// operands' elements of the product k = p.
template <typename T, typename X, typename Y>
T in_kernel_order(bool dot, int64_t k, X x, Y y, const T* bias) {
  T v = T(0);
  if (dot) {
    T lane[32];
    for (int l = 0; l < 32; ++l) {
      lane[l] = T(0);
      for (int64_t p = l; p < k; p += 32) lane[l] = std::fma(x(p), y(p), lane[l]);
    }
    for (int o = 16; o > 0; o /= 2) {
      T next[32];
      for (int l = 0; l < 32; ++l) next[l] = lane[l] + lane[l ^ o];
      std::copy(next, next + 32, lane);
    }
    v = lane[0];
  } else {
    for (int64_t p = 0; p < k; ++p) v = std::fma(x(p), y(p), v);
  }
  return bias != nullptr ? v + *bias : v;
}

// Column r of a stored [k, m] (rows lda apart) summed as reduce.cuh's reduce_columns sums it:
// `split` thread rows (about 16 elements each, a power of two up to 32), row t folding elements
// t, t + split, ... from +0, then a tree joining rows split / 2 apart, then split / 4, ...
template <typename T>
T column_sum_as_cuda(const T* a, int64_t lda, int64_t r, int64_t k) {
  int split = 1;
  while (split < 32 && split * 2 * 16 <= k) split *= 2;
  std::vector<T> part(split, T(0));
  for (int t = 0; t < split; ++t)
    for (int64_t p = t; p < k; p += split) part[t] = part[t] + a[p * lda + r];
  for (int s = split / 2; s > 0; s /= 2)
    for (int t = 0; t < s; ++t) part[t] = part[t] + part[t + s];
  return part[0];
}

// Runs `cs` in T and checks every output against the reference and every other element of c
// against its sentinel.
template <typename T>
void check(const Case& cs, uint32_t seed) {
  const int64_t m = cs.m, n = cs.n, k = cs.k;
  // dot: a [m, k], b [n, k]; serial: a [m, k] or [k, m] (trans_a), b [k, n].
  const int64_t a_rows = cs.dot || !cs.trans_a ? m : k, a_cols = cs.dot || !cs.trans_a ? k : m;
  const int64_t b_rows = cs.dot ? n : k, b_cols = cs.dot ? k : n;
  const int64_t lda = a_cols + cs.pad, ldb = b_cols + cs.pad, ldc = n + cs.pad;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<T> a_storage(a_rows * lda + cs.offset), b_storage(b_rows * ldb + cs.offset);
  std::vector<T> bias(n), in(m * ldc);
  T* const a = a_storage.data() + cs.offset;
  T* const b = b_storage.data() + cs.offset;
  for (T& v : a_storage) v = static_cast<T>(u(rng));
  for (T& v : b_storage) v = static_cast<T>(u(rng));
  for (T& v : bias) v = static_cast<T>(u(rng));
  for (T& v : in) v = static_cast<T>(u(rng));
  const T sentinel = static_cast<T>(12345);
  // Room for whatever a tile or a thread past c's edge would store, to see that none does.
  std::vector<T> c((m + 4) * ldc + 16, sentinel), sums(m + 8, sentinel);
  const Entry run = gemm_kernels().function<Entry>(testing::typed_name<T>("small_gemm"));
  run(cs.dot, m, n, k, cs.trans_a, a, lda, b, ldb, c.data(), ldc, cs.bias ? bias.data() : nullptr,
      static_cast<int>(cs.act), cs.scalar, is_grad(cs.act) ? in.data() : nullptr,
      cs.sums ? sums.data() : nullptr);
  const double eps = std::numeric_limits<T>::epsilon();
  // The operands' elements of output (i, j)'s product k = p.
  auto x_of = [&](int64_t i, int64_t p) {
    return cs.dot || !cs.trans_a ? a[i * lda + p] : a[p * lda + i];
  };
  auto y_of = [&](int64_t j, int64_t p) { return cs.dot ? b[j * ldb + p] : b[p * ldb + j]; };
  int wrong = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double v = 0, scale = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double x = x_of(i, p), y = y_of(j, p);
        v += x * y;
        scale += std::abs(x * y);
      }
      if (cs.bias) v += bias[j], scale += std::abs(bias[j]);
      const double want = act_of(cs.act, v, in[i * ldc + j], cs.scalar);
      const double got = c[i * ldc + j];
      if (!(std::abs(got - want) <= 16 * eps * (scale + std::abs(want) + 1e-30)) && wrong++ < 5)
        FAIL_CHECK("c[" << i << "," << j << "] = " << got << ", want " << want);
      if (cs.act != Op::Matmul) continue;  // the host's libm is not CUDA's: values only
      const T bits = in_kernel_order<T>(
          cs.dot, k, [&](int64_t p) { return x_of(i, p); }, [&](int64_t p) { return y_of(j, p); },
          cs.bias ? &bias[j] : nullptr);
      if (std::memcmp(&c[i * ldc + j], &bits, sizeof(T)) != 0 && wrong++ < 5)
        FAIL_CHECK("c[" << i << "," << j << "] = " << got << ", not the kernels' order's " << bits);
    }
  for (int64_t at = 0; at < static_cast<int64_t>(c.size()); ++at)
    if ((at >= m * ldc || at % ldc >= n) && c[at] != sentinel && wrong++ < 5)
      FAIL_CHECK("c[" << at << "] past the outputs was written");
  for (int64_t r = 0; r < static_cast<int64_t>(sums.size()); ++r) {
    if (!cs.sums || r >= m) {
      if (sums[r] != sentinel && wrong++ < 5) FAIL_CHECK("sums[" << r << "] was written");
      continue;
    }
    double want = 0, scale = 0;
    for (int64_t p = 0; p < k; ++p) want += a[p * lda + r], scale += std::abs(a[p * lda + r]);
    const T bits = column_sum_as_cuda(a, lda, r, k);
    if ((std::memcmp(&sums[r], &bits, sizeof(T)) != 0 ||
         !(std::abs(sums[r] - want) <= 16 * eps * (scale + 1e-30))) &&
        wrong++ < 5)
      FAIL_CHECK("sums[" << r << "] = " << sums[r] << ", want " << bits << " (" << want << ")");
  }
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("small GEMM kernels compute each output over both layouts and edges (emulated)",
          "[nvrtc][emulated][small_gemm]") {
  // Tiles and columns that end inside c and past it, k below and above a warp's 32 lanes and not
  // a multiple of them, a single output; a, b and c with longer rows than they use; serial k with
  // one output per thread (a small c) and four (c of 16,384 outputs or more). std::vector's
  // storage is 16-byte aligned: rows of a multiple of 16 bytes are staged in vectors.
  const std::vector<Case> cases = {
      {true, 1, 1, 1},
      {true, 5, 7, 33},
      {true, 8, 12, 64, false, 3},
      {true, 33, 10, 100},
      {false, 1, 1, 1},
      {false, 9, 130, 7},
      {false, 7, 5, 40, true},
      {false, 12, 129, 32, true, 2},
      {false, 4, 128, 3, false, 1},
      {false, 130, 130, 5, true, 1},
      {false, 129, 131, 9},
      // k over several staged chunks (kDot: 800 floats or 384 doubles; kSerialK: 126 floats or 63
      // doubles a chunk at one output a thread, 124 or 62 at four), the
      // chunks' rows in 16-byte vectors (a row length of a multiple of 4 floats or 2 doubles) or
      // element by element, a row that ends inside its last vector.
      {true, 5, 21, 900},
      {true, 3, 17, 901, false, 3},
      {true, 9, 40, 1024, false, 1},
      // kDot chunks of 96 and 160 elements: rows of 24 or 40 vectors of floats (48 or 80 of
      // doubles), which a block's 128 threads step through a row and more at a time.
      {true, 7, 19, 90},
      {true, 6, 33, 150, false, 2},
      {false, 9, 130, 150},
      {false, 9, 132, 150},
      {false, 6, 45, 130, true},
      {false, 6, 44, 130, true},
      {false, 140, 150, 130, true, 2},
      {false, 33, 260, 200, false, 4},
      {false, 140, 150, 130},  // four rows a thread, a not transposed, two chunks
      // a and b one element into their storage: rows of a multiple of 16 bytes, not aligned to
      // them (element by element).
      {true, 6, 20, 900, false, 0, false, Op::Matmul, 0, false, 1},
      {false, 9, 132, 150, false, 0, false, Op::Matmul, 0, false, 1},
      {false, 6, 44, 130, true, 0, false, Op::Matmul, 0, false, 1},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& cs = cases[i];
    INFO("case " << i << ": " << (cs.dot ? "dot" : "serial k") << " m " << cs.m << " n " << cs.n
                 << " k " << cs.k << (cs.trans_a ? ", a transposed" : "") << ", pad " << cs.pad);
    check<float>(cs, 1 + static_cast<uint32_t>(i));
    check<double>(cs, 100 + static_cast<uint32_t>(i));
  }
}

// kSerialK's product loop may load the 16-byte vector past a chunk's last element of a, unused;
// a's rows end the staged operands, so its launch reserves a vector past them (memcheck on an
// H200 reported the load where it did not), within the most a block may have.
TEST_CASE("a small GEMM's serial launch reserves a vector past a's staged rows",
          "[nvrtc][small_gemm]") {
  using Short = long long (*)(int);
  for (const char* name : {"serial_slack_short_f32", "serial_slack_short_f64"})
    for (const int rows : {1, 4}) {
      INFO(name << ", rows " << rows);
      CHECK(gemm_kernels().function<Short>(name)(rows) == 0);
    }
}

TEST_CASE("a small GEMM's blocks past the product sum a's columns as CUDA's Sum does (emulated)",
          "[nvrtc][emulated][small_gemm]") {
  // gy^T x and sum(gy, 0) over k rows of gy: 1 thread row of the column sum (k < 32), 2 (32),
  // 4 (64, 100), 8 (128, 200), 16 (256) and 32 (512); one output per thread, or four (130 x 200);
  // a's rows longer than its m.
  const std::vector<Case> cases = {
      {false, 5, 7, 2, true},       {false, 33, 20, 31, true, 3}, {false, 10, 100, 32, true},
      {false, 2, 3, 64, true},      {false, 130, 200, 100, true}, {false, 12, 9, 512, true, 1},
      {false, 3, 129, 33, true, 2}, {false, 17, 20, 128, true},   {false, 6, 40, 200, true, 1},
      {false, 9, 5, 256, true},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    Case cs = cases[i];
    cs.sums = true;
    INFO("case " << i << ": m " << cs.m << " n " << cs.n << " k " << cs.k << ", pad " << cs.pad);
    check<float>(cs, 200 + static_cast<uint32_t>(i));
    check<double>(cs, 300 + static_cast<uint32_t>(i));
  }
}

TEST_CASE(
    "small GEMM kernels finish each output with a bias, an activation or its gradient "
    "(emulated)",
    "[nvrtc][emulated][small_gemm]") {
  struct Finish {
    Op act;
    double scalar;
  };
  const Finish forward[] = {{Op::Matmul, 0}, {Op::Relu, 0}, {Op::LeakyRelu, 0.1}, {Op::Sigmoid, 0},
                            {Op::Tanh, 0},   {Op::Gelu, 0}, {Op::Gelu, kGeluTanh}};
  for (const Finish& f : forward) {
    INFO("linear with a bias and act " << static_cast<int>(f.act) << ", scalar " << f.scalar);
    check<float>({true, 6, 9, 50, false, 0, true, f.act, f.scalar}, 7);
    check<double>({true, 6, 9, 50, false, 0, true, f.act, f.scalar}, 8);
  }
  const Finish backward[] = {{Op::ReluGrad, 0},    {Op::LeakyReluGrad, 0.2},
                             {Op::SigmoidGrad, 0}, {Op::TanhGrad, 0},
                             {Op::GeluGrad, 0},    {Op::GeluGrad, kGeluTanh}};
  for (const Finish& f : backward) {
    INFO("product with act gradient " << static_cast<int>(f.act) << ", scalar " << f.scalar);
    check<float>({false, 6, 131, 20, false, 0, false, f.act, f.scalar}, 9);
    check<double>({true, 5, 9, 40, false, 0, false, f.act, f.scalar}, 10);
  }
}

TEST_CASE("a small GEMM's relu passes a NaN product on, as the relu kernel does (emulated)",
          "[nvrtc][emulated][small_gemm]") {
  // a's row 1 holds a NaN: row 1 of c is NaN before and after relu; the other rows are not.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a = {1, -2, 3, nan, 1, 1}, b = {1, 1, 1, -1, -1, -1}, bias = {0, 0};
  std::vector<float> c(4, 0);
  const Entry run = gemm_kernels().function<Entry>("small_gemm_f32");
  run(true, 2, 2, 3, false, a.data(), 3, b.data(), 3, c.data(), 2, bias.data(),
      static_cast<int>(Op::Relu), 0, nullptr, nullptr);
  CHECK(c[0] == 2.0f);  // relu(1 - 2 + 3)
  CHECK(c[1] == 0.0f);  // relu(-2)
  CHECK(std::isnan(c[2]));
  CHECK(std::isnan(c[3]));
}
