// The loss-gradient GEMM kernel (kernels/cuda/loss_grad_gemm.cuh) runs on the host
// (emulated_kernel.h) against the kernels it replaces, also emulated: where it computes the
// logits too, the kDot small GEMM computing x w^T + bias, then the cross-entropy gradient kernel
// (softmax_loss.cuh) writing g, then the kSerialK small GEMM (small_gemm.cuh) computing g b, all
// launched as the .cu files launch them. The logits, the product and g must have the same bits
// (NaN rows included), in float32 and float64, with int64 and int32 labels, one or four rows of g
// per block, one or several column blocks, k up to the most one chunk holds, linears of several
// inner lengths (below a warp, past it, not a multiple of a vector, past one chunk of the dot
// kernel; rows of x and w not 16-byte aligned) with and without a bias, b's rows not 16-byte
// aligned, each finish (none, an activation gradient), ignored rows, every row ignored (a zero
// gradient) and an out-of-range label (reported as the gradient kernel reports it, or as the
// loss where the kernel computes the logits). Nothing past c's outputs, g's or the logits'
// elements may be written. The [cuda] tests check the device's bits against eager.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "runtime/cuda.h"
#include "runtime/ops.h"
#include "runtime/small_gemm.h"
#include "tests/nvrtc/emulated_kernel.h"

using namespace encore;

namespace {

constexpr const char* kSource = R"cuda(
#include "kernels/cuda/loss_grad_gemm.cuh"
using namespace encore::kernels::cuda;
using encore::cuda::DeviceErrorKind;
using encore::cuda::DeviceErrorSlot;
// small_gemm.cu's launch of the loss-gradient kernel; with x, computing the logits from x [m,
// hidden], w [k, hidden] and bias (or none) into `logits`.
template <typename T, typename L, int kRows, bool kLinear>
void fused_at(long long m, long long n, long long k, const LossGradRows<T, L>& loss,
              const LogitsRows<T>& lin, const T* b, long long ldb, const GemmFinish<T>& f, T* c) {
  emulate_launch(small_gemm_launch(false, m, n).blocks, kSmallGemmThreads,
                 loss_grad_shared_bytes<T, kRows, kLinear>(k, lin.hidden), [&] {
    gemm_loss_grad_kernel<T, L, kRows, kLinear>(m, n, k, loss, lin, b, ldb, stages_vectors(b, ldb),
                                                c, n, f);
  });
}
template <typename T, typename L>
void fused(long long m, long long n, long long k, T* logits, const L* labels, const T* gy,
           long long ignore, const T* b, long long ldb, int act, const T* act_in, T* c, T* g,
           DeviceErrorSlot errors, const T* x, const T* w, const T* bias, long long hidden) {
  const GemmFinish<T> f{nullptr, act_in, static_cast<encore::Op>(act), T(0)};
  const LossGradRows<T, L> loss{logits, labels, gy, g, ignore, errors, DeviceErrorKind::Label};
  const LogitsRows<T> lin{x, w, bias, logits, hidden, x != nullptr && stages_vectors(x, hidden),
                          x != nullptr && stages_vectors(w, hidden)};
  const bool one = small_gemm_launch(false, m, n).rows == 1;
  if (x == nullptr && one) fused_at<T, L, 1, false>(m, n, k, loss, lin, b, ldb, f, c);
  if (x == nullptr && !one) fused_at<T, L, kSerialRows, false>(m, n, k, loss, lin, b, ldb, f, c);
  if (x != nullptr && one) fused_at<T, L, 1, true>(m, n, k, loss, lin, b, ldb, f, c);
  if (x != nullptr && !one) fused_at<T, L, kSerialRows, true>(m, n, k, loss, lin, b, ldb, f, c);
}
// With x, small_gemm.cu's kDot launch of the linear (x w^T + bias into logits); then
// softmax_loss.cu's gradient launch, then small_gemm.cu's kSerialK launch of g b.
template <typename T, typename L>
void apart(long long m, long long n, long long k, T* logits, const L* labels, const T* gy,
           long long ignore, const T* b, long long ldb, int act, const T* act_in, T* c, T* g,
           DeviceErrorSlot errors, const T* x, const T* w, const T* bias, long long hidden) {
  if (x != nullptr) {
    const GemmFinish<T> lf{bias};
    const int chunk = dot_chunk<T>(hidden);
    emulate_launch(small_gemm_launch(true, m, k).blocks, kSmallGemmThreads,
                   dot_shared_bytes<T>(chunk), [&] {
      gemm_dot_kernel<T>(m, k, hidden, chunk, x, hidden, stages_vectors(x, hidden), w, hidden,
                         stages_vectors(w, hidden), logits, k, lf);
    });
  }
  emulate_launch(cross_entropy_grad_blocks(m), kThreads, [&] {
    cross_entropy_grad_kernel<T, L>(logits, labels, gy, g, m, k, ignore, errors,
                                    DeviceErrorKind::Label, encore::Op::SoftmaxCrossEntropyGrad);
  });
  const GemmFinish<T> f{nullptr, act_in, static_cast<encore::Op>(act), T(0)};
  const GemmLaunch l = small_gemm_launch(false, m, n);
  const bool vectors_b = stages_vectors(b, ldb);
  if (l.rows == 1) {
    const int chunk = serial_chunk<T, 1>(k);
    emulate_launch(l.blocks, kSmallGemmThreads, serial_shared_bytes<T, 1>(chunk), [&] {
      gemm_serial_k_kernel<T, 1>(m, n, k, chunk, false, g, k, b, ldb, vectors_b, c, n, f);
    });
  } else {
    const int chunk = serial_chunk<T, kSerialRows>(k);
    emulate_launch(l.blocks, kSmallGemmThreads, serial_shared_bytes<T, kSerialRows>(chunk), [&] {
      gemm_serial_k_kernel<T, kSerialRows>(m, n, k, chunk, false, g, k, b, ldb, vectors_b, c, n,
                                           f);
    });
  }
}
#define ENTRIES(T, L, s)                                                                       \
  extern "C" void fused_##s(long long m, long long n, long long k, T* logits, const L* labels, \
                            const T* gy, long long ignore, const T* b, long long ldb, int act, \
                            const T* act_in, T* c, T* g, DeviceErrorSlot errors, const T* x,   \
                            const T* w, const T* bias, long long hidden) {                     \
    fused<T, L>(m, n, k, logits, labels, gy, ignore, b, ldb, act, act_in, c, g, errors, x, w,  \
                bias, hidden);                                                                 \
  }                                                                                            \
  extern "C" void apart_##s(long long m, long long n, long long k, T* logits, const L* labels, \
                            const T* gy, long long ignore, const T* b, long long ldb, int act, \
                            const T* act_in, T* c, T* g, DeviceErrorSlot errors, const T* x,   \
                            const T* w, const T* bias, long long hidden) {                     \
    apart<T, L>(m, n, k, logits, labels, gy, ignore, b, ldb, act, act_in, c, g, errors, x, w,  \
                bias, hidden);                                                                 \
  }
ENTRIES(float, long long, f32_i64)
ENTRIES(float, int, f32_i32)
ENTRIES(double, long long, f64_i64)
ENTRIES(double, int, f64_i32)
)cuda";

const testing::HostObject& loss_grad_kernels() {
  static const testing::HostObject object({}, kSource);
  return object;
}

template <typename T, typename L>
using Entry = void (*)(long long, long long, long long, T*, const L*, const T*, long long, const T*,
                       long long, int, const T*, T*, T*, cuda::DeviceErrorSlot, const T*, const T*,
                       const T*, long long);

template <typename T, typename L>
Entry<T, L> entry(const char* kind) {
  return loss_grad_kernels().function<Entry<T, L>>(cat(
      kind, std::is_same_v<T, float> ? "_f32" : "_f64", std::is_same_v<L, int> ? "_i32" : "_i64"));
}

struct Case {
  int64_t m, n, k;  // c [m, n] = g [m, k] b [k, n]; k is cut to the most T allows
  Op act = Op::Matmul;
  int64_t offset = 0;  // b this many elements into its storage (1: not 16-byte aligned)
  int64_t pad = 0;     // b's rows this many elements longer than n
  bool all_ignored = false;
  int64_t bad_row = -1;  // a row whose label is k, out of range
  // > 0: the logits computed from x [m, hidden] and w [k, hidden] (each `offset` elements into
  // their storage too), plus a bias where `bias`.
  int64_t hidden = 0;  // cut to 1000 (float32) or 400 (float64)
  bool bias = false;
};

constexpr int64_t kIgnore = -1;

// Runs both ways and compares c, g and the error reports byte for byte.
template <typename T, typename L>
void check(Case cs, uint32_t seed) {
  cs.k = std::min(cs.k, std::is_same_v<T, float> ? kMaxLossGradClasses32 : kMaxLossGradClasses64);
  const int64_t m = cs.m, n = cs.n, k = cs.k, ldb = n + cs.pad;
  // Past float32's 800 and float64's 384, the dot kernel's linear takes several chunks of k.
  const int64_t hidden = std::min<int64_t>(cs.hidden, std::is_same_v<T, float> ? 1000 : 400);
  INFO("m " << m << ", n " << n << ", k " << k << ", act " << op_name(cs.act) << ", offset "
            << cs.offset << ", pad " << cs.pad << (cs.all_ignored ? ", all ignored" : "")
            << ", bad row " << cs.bad_row << ", hidden " << hidden << (cs.bias ? ", bias" : ""));
  // What the kernel's launch requires (cuda_small_gemm_computes_logits' bound).
  REQUIRE(loss_grad_shared_elements(k, kLossGradRows, hidden, 16 / sizeof(T)) * sizeof(T) <=
          kSmallGemmSharedBytes);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-3, 3);
  std::vector<T> logits(m * k), b_storage(k * ldb + cs.offset), act_in(m * n);
  std::vector<T> x_storage(m * hidden + cs.offset), w_storage(k * hidden + cs.offset), bias(k);
  for (T& v : logits) v = static_cast<T>(u(rng));
  for (T& v : x_storage) v = static_cast<T>(u(rng));
  for (T& v : w_storage) v = static_cast<T>(u(rng) / 4);
  for (T& v : bias) v = static_cast<T>(u(rng));
  for (T& v : b_storage) v = static_cast<T>(u(rng) / 3);
  for (T& v : act_in) v = static_cast<T>(u(rng));
  std::vector<L> labels(m);
  for (int64_t i = 0; i < m; ++i)
    labels[i] = static_cast<L>(cs.all_ignored || i % 5 == 3 ? kIgnore : (i * 7 + 1) % k);
  if (cs.bad_row >= 0) labels[cs.bad_row] = static_cast<L>(k);
  const T gy = T(0.75);
  const T* b = b_storage.data() + cs.offset;
  const T sentinel = static_cast<T>(12345);
  // Room past c and g for whatever a thread or block past their edges would store.
  std::vector<T> c1((m + 4) * n + 256, sentinel), c2 = c1, g1(m * k + 256, sentinel), g2 = g1;
  // The logits each way: read (the same values), or computed into sentinels.
  std::vector<T> l1 = logits, l2 = logits;
  if (hidden > 0) l1.assign(m * k + 256, sentinel), l2 = l1;
  testing::HostErrorSlot e1, e2;
  const T* in = cs.act != Op::Matmul ? act_in.data() : nullptr;
  const T* x = hidden > 0 ? x_storage.data() + cs.offset : nullptr;
  const T* w = hidden > 0 ? w_storage.data() + cs.offset : nullptr;
  const T* pbias = cs.bias ? bias.data() : nullptr;
  entry<T, L>("fused")(m, n, k, l1.data(), labels.data(), &gy, kIgnore, b, ldb,
                       static_cast<int>(cs.act), in, c1.data(), g1.data(), e1.slot(), x, w, pbias,
                       hidden);
  entry<T, L>("apart")(m, n, k, l2.data(), labels.data(), &gy, kIgnore, b, ldb,
                       static_cast<int>(cs.act), in, c2.data(), g2.data(), e2.slot(), x, w, pbias,
                       hidden);
  int wrong = 0;
  for (size_t at = 0; at < l1.size(); ++at)
    if (std::memcmp(&l1[at], &l2[at], sizeof(T)) != 0 && wrong++ < 5)
      FAIL_CHECK("logits[" << at << "] = " << l1[at] << ", apart " << l2[at]);
  for (size_t at = 0; at < c1.size(); ++at)
    if (std::memcmp(&c1[at], &c2[at], sizeof(T)) != 0 && wrong++ < 5)
      FAIL_CHECK("c[" << at << "] = " << c1[at] << ", apart " << c2[at]);
  for (size_t at = 0; at < g1.size(); ++at)
    if (std::memcmp(&g1[at], &g2[at], sizeof(T)) != 0 && wrong++ < 5)
      FAIL_CHECK("g[" << at << "] = " << g1[at] << ", apart " << g2[at]);
  CHECK(wrong == 0);
  // The apart kernels wrote c and g and nothing past them (so neither did the fused one).
  for (size_t at = static_cast<size_t>(m * n); at < c2.size(); ++at) wrong += c2[at] != sentinel;
  for (size_t at = static_cast<size_t>(m * k); at < g2.size(); ++at) wrong += g2[at] != sentinel;
  for (size_t at = static_cast<size_t>(m * k); at < l2.size(); ++at) wrong += l2[at] != sentinel;
  for (int64_t at = 0; at < m * k; ++at) wrong += g2[at] == sentinel;
  CHECK(wrong == 0);
  // g's rows: an ignored row is 0, every other row sums to 0 (within rounding), the bad one NaN.
  for (int64_t i = 0; i < m; ++i) {
    const T* row = &g1[i * k];
    if (i == cs.bad_row) {
      CHECK(std::all_of(row, row + k, [](T v) { return v != v; }));
    } else if (labels[i] == kIgnore) {
      CHECK(std::all_of(row, row + k, [](T v) { return v == 0; }));
    } else {
      double sum = 0;
      for (int64_t p = 0; p < k; ++p) sum += row[p];
      CHECK(std::abs(sum) <= 1e-5);
    }
  }
  CHECK(e1.claim == (cs.bad_row >= 0 ? 1u : 0u));
  CHECK(e1.claim == e2.claim);
  CHECK(std::equal(e1.record + 1, e1.record + 4, e2.record + 1));
  CHECK(e1.kind() == e2.kind());
  if (cs.bad_row >= 0) {
    // Where the kernel computes the logits, the plan runs it before the loss, which eagerly fails
    // first: it reports as the loss.
    CHECK(e1.op() == static_cast<long long>(hidden > 0 ? Op::SoftmaxCrossEntropy
                                                       : Op::SoftmaxCrossEntropyGrad));
    CHECK(e2.op() == static_cast<long long>(Op::SoftmaxCrossEntropyGrad));
    CHECK(e1.record[1] == k);
    CHECK(e1.record[2] == cs.bad_row);
  }
}

}  // namespace

TEST_CASE(
    "the loss-gradient GEMM kernel gives the bits of the linear, gradient and product kernels "
    "(emulated)",
    "[nvrtc][emulated][small_gemm]") {
  // One row of g per block (c under 16,384 outputs) or four, one column block or several, rows
  // past c's edge in the last row block, k from 1 to one chunk's most, more rows than a block's
  // threads.
  const std::vector<Case> cases = {
      {1, 1, 1},
      {12, 16, 10},
      {12, 16, 10, Op::ReluGrad},
      {5, 7, 3, Op::Matmul, 1, 3},  // b not aligned for vectors
      {8, 12, 100, Op::TanhGrad},
      {64, 300, 10, Op::ReluGrad},  // four rows a block, three column blocks
      {66, 260, 124, Op::Matmul},   // a last row block of two rows
      {20, 1000, 33, Op::SigmoidGrad, 0, 4},
      {300, 40, 10},  // more labels to count than a block has threads
      // The logits computed too: inner lengths below a warp, past it, not a multiple of a
      // vector; x and w not 16-byte aligned; with and without a bias.
      {12, 16, 10, Op::ReluGrad, 0, 0, false, -1, 100, true},
      {12, 16, 10, Op::Matmul, 0, 0, false, -1, 7, false},
      {5, 7, 3, Op::Matmul, 1, 3, false, -1, 33, true},
      {64, 300, 10, Op::TanhGrad, 0, 0, false, -1, 45, true},
      {66, 130, 24, Op::Matmul, 0, 0, false, 9, 64, false},
      {8, 12, 10, Op::ReluGrad, 0, 0, true, -1, 200, true},
      {10, 16, 10, Op::ReluGrad, 0, 0, false, -1, 1000, true},  // the linear in several chunks
      {12, 16, 10, Op::Matmul, 0, 0, true},
      {12, 16, 10, Op::ReluGrad, 0, 0, false, 7},
      {64, 300, 10, Op::Matmul, 0, 0, false, 62},
  };
  uint32_t seed = 1;
  for (const Case& cs : cases) {
    check<float, long long>(cs, seed++);
    check<float, int>(cs, seed++);
    check<double, long long>(cs, seed++);
    check<double, int>(cs, seed++);
  }
}
