// The weight-gradient GEMM kernel that updates its parameters by Adam
// (kernels/cuda/weight_adam_gemm.cuh) runs on the host (emulated_kernel.h) against the kernels it
// replaces, also emulated: the kSerialK small GEMM computing a^T b (and a's column sums), then the
// Adam update kernel (optim.cuh) over the weight's and the bias's groups, both launched as the .cu
// files launch them. The gradients, the parameters, m, v and the step counts must have the same
// bits, in float32 and float64, Adam and AdamW, with and without the bias, one or four rows a
// block, one or several column blocks, k over one chunk or several, b's rows not 16-byte aligned,
// several step counts; a step count the counter cannot keep is reported (as the fused step's, the
// weight parameter 0 and the bias 1). Nothing past the arrays may be written. The fused kernel
// runs a second time reading its attributes through its pointer (where a static plan's graph
// writes them: KernelArgs::device_attrs), with other values as its argument, for the same bits.
// The [cuda] tests check the device's bits against eager.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "runtime/cuda.h"
#include "runtime/kernel_abi.h"
#include "runtime/ops.h"
#include "tests/nvrtc/emulated_kernel.h"

using namespace encore;

namespace {

constexpr const char* kSource = R"cuda(
#include "kernels/cuda/optim.cuh"
#include "kernels/cuda/weight_adam_gemm.cuh"
using namespace encore;
using namespace encore::kernels::cuda;
using encore::cuda::DeviceErrorSlot;
// in: a [k, m], b [k, n] (ldb apart), then the weight's group (p, g, m, v, t) and, with `bias`,
// the bias's: small_gemm.cu's launch of the fused kernel. `live`: the kernel reads `attrs` through
// its pointer, and gets others as its argument.
template <typename T>
void fused(long long m, long long n, long long k, long long ldb, const BufferView* in, bool bias,
           const AdamAttrs& attrs, bool live, DeviceErrorSlot errors) {
  const AdamAttrs other{.lr = 7, .beta1 = 0.5, .beta2 = 0.5, .eps = 1, .weight_decay = 3};
  const T* a = in[0].as<T>();
  const T* b = in[1].as<T>();
  const auto arrays = [&](int g0) {
    return AdamArrays<T>{in[g0].as<T>(), in[g0 + 2].as<T>(), in[g0 + 3].as<T>(),
                         in[g0 + 4].as<int64_t>()};
  };
  const GemmLaunch l = small_gemm_launch(false, m, n, bias);
  auto launch = [&]<int kRows>() {
    const int chunk = serial_chunk<T, kRows>(k);
    emulate_launch(l.blocks, kSmallGemmThreads, serial_shared_bytes<T, kRows>(chunk), [&] {
      gemm_weight_adam_kernel<T, kRows>(m, n, k, chunk, a, m, b, ldb, stages_vectors(b, ldb),
                                        in[3].as<T>(), bias ? in[8].as<T>() : nullptr, arrays(2),
                                        bias ? arrays(7) : AdamArrays<T>{}, live ? other : attrs,
                                        live ? &attrs : nullptr, Op::WeightGradAdam, errors);
    });
  };
  if (l.rows == 1) {
    launch.template operator()<1>();
  } else {
    launch.template operator()<kSerialRows>();
  }
}
// The kSerialK launch of a^T b (and the column sums), then optim.cu's Adam launch over the groups.
template <typename T>
void apart(long long m, long long n, long long k, long long ldb, const BufferView* in, bool bias,
           const AdamAttrs& attrs, DeviceErrorSlot errors) {
  const T* a = in[0].as<T>();
  const T* b = in[1].as<T>();
  GemmFinish<T> f;
  f.sums = bias ? in[8].as<T>() : nullptr;
  const GemmLaunch l = small_gemm_launch(false, m, n, bias);
  auto launch = [&]<int kRows>() {
    const int chunk = serial_chunk<T, kRows>(k);
    emulate_launch(l.blocks, kSmallGemmThreads, serial_shared_bytes<T, kRows>(chunk), [&] {
      gemm_serial_k_kernel<T, kRows>(m, n, k, chunk, true, a, m, b, ldb, stages_vectors(b, ldb),
                                     in[3].as<T>(), n, f);
    });
  };
  if (l.rows == 1) {
    launch.template operator()<1>();
  } else {
    launch.template operator()<kSerialRows>();
  }
  for_each_launch<Op::AdamUpdate>(
      std::span<const BufferView>(in + 2, bias ? 10 : 5),
      [&](const TensorTable<4>& tab, const Counters& c, unsigned blocks) {
        emulate_launch(blocks, kThreads, [&] { adam_kernel<T>(tab, c, attrs, nullptr, errors); });
      });
}
#define ENTRIES(T, s)                                                                           \
  extern "C" void fused_##s(long long m, long long n, long long k, long long ldb,               \
                            const BufferView* in, bool bias, const AdamAttrs* attrs,            \
                            DeviceErrorSlot errors) {                                           \
    fused<T>(m, n, k, ldb, in, bias, *attrs, false, errors);                                    \
  }                                                                                             \
  extern "C" void fused_live_##s(long long m, long long n, long long k, long long ldb,          \
                                 const BufferView* in, bool bias, const AdamAttrs* attrs,       \
                                 DeviceErrorSlot errors) {                                      \
    fused<T>(m, n, k, ldb, in, bias, *attrs, true, errors);                                     \
  }                                                                                             \
  extern "C" void apart_##s(long long m, long long n, long long k, long long ldb,               \
                            const BufferView* in, bool bias, const AdamAttrs* attrs,            \
                            DeviceErrorSlot errors) {                                           \
    apart<T>(m, n, k, ldb, in, bias, *attrs, errors);                                           \
  }
ENTRIES(float, f32)
ENTRIES(double, f64)
)cuda";

using Entry = void (*)(long long, long long, long long, long long, const BufferView*, bool,
                       const AdamAttrs*, cuda::DeviceErrorSlot);

template <typename T>
Entry entry(const char* kind) {
  static const testing::HostObject object({}, kSource);
  return object.function<Entry>(cat(kind, std::is_same_v<T, float> ? "_f32" : "_f64"));
}

struct Case {
  int64_t m, n, k;  // the weight [m, n] = a^T b, a [k, m], b [k, n]
  bool bias = true;
  bool decoupled = false;
  double weight_decay = 0;
  int64_t step = 0;    // the step count before the call
  int64_t offset = 0;  // b this many elements into its storage (1: not 16-byte aligned)
  int64_t pad = 0;     // b's rows this many elements longer than n
};

// Every array of a call, each with room past its end that nothing may write.
template <typename T>
struct Arrays {
  static constexpr int kRoom = 256;
  std::vector<T> a, b, w[4], bias[4];  // w, bias: p, g, m, v
  int64_t t[2] = {0, 0};
  std::vector<BufferView> in;

  Arrays(const Case& cs, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> u(-2, 2), pos(0, 1);
    const int64_t m = cs.m, n = cs.n, k = cs.k, ldb = n + cs.pad;
    a.resize(k * m);
    b.resize(k * ldb + cs.offset);
    for (T& v : a) v = static_cast<T>(u(rng));
    for (T& v : b) v = static_cast<T>(u(rng) / 3);
    for (int i = 0; i < 4; ++i) {
      w[i].assign(m * n + kRoom, static_cast<T>(12345));
      bias[i].assign(m + kRoom, static_cast<T>(12345));
      if (i == 1) continue;  // the gradients: written by the kernels
      for (int64_t e = 0; e < m * n; ++e) w[i][e] = static_cast<T>(i == 3 ? pos(rng) : u(rng));
      for (int64_t e = 0; e < m; ++e) bias[i][e] = static_cast<T>(i == 3 ? pos(rng) : u(rng));
    }
    t[0] = t[1] = cs.step;
    const DType dtype = std::is_same_v<T, float> ? DType::Float32 : DType::Float64;
    in.push_back({a.data(), Shape{k, m}, dtype});
    in.push_back({b.data() + cs.offset, Shape{k, n}, dtype});
    for (int i = 0; i < 4; ++i) in.push_back({w[i].data(), Shape{m, n}, dtype});
    in.push_back({&t[0], Shape{}, DType::Int64});
    for (int i = 0; i < 4; ++i) in.push_back({bias[i].data(), Shape{m}, dtype});
    in.push_back({&t[1], Shape{}, DType::Int64});
  }
};

template <typename T>
int differences(const char* what, const std::vector<T>& x, const std::vector<T>& y) {
  int wrong = 0;
  for (size_t at = 0; at < x.size(); ++at)
    if (std::memcmp(&x[at], &y[at], sizeof(T)) != 0 && wrong++ < 5)
      FAIL_CHECK(what << "[" << at << "] = " << x[at] << ", apart " << y[at]);
  return wrong;
}

template <typename T>
void check(const Case& cs, uint32_t seed) {
  INFO("m " << cs.m << ", n " << cs.n << ", k " << cs.k << (cs.bias ? ", bias" : "")
            << (cs.decoupled ? ", AdamW" : "") << ", weight decay " << cs.weight_decay << ", step "
            << cs.step << ", offset " << cs.offset << ", pad " << cs.pad << ", " << sizeof(T) * 8
            << "-bit");
  Arrays<T> one(cs, seed), two(cs, seed), three(cs, seed);
  const AdamAttrs attrs{.lr = 0.01, .weight_decay = cs.weight_decay, .decoupled = cs.decoupled};
  testing::HostErrorSlot e1, e2, e3;
  const int64_t ldb = cs.n + cs.pad;
  entry<T>("fused")(cs.m, cs.n, cs.k, ldb, one.in.data(), cs.bias, &attrs, e1.slot());
  entry<T>("apart")(cs.m, cs.n, cs.k, ldb, two.in.data(), cs.bias, &attrs, e2.slot());
  entry<T>("fused_live")(cs.m, cs.n, cs.k, ldb, three.in.data(), cs.bias, &attrs, e3.slot());
  const char* names[4] = {"p", "g", "m", "v"};
  int wrong = 0;
  // (A count the counter cannot keep is reported; what the update then writes is not defined.)
  for (int i = cs.step >= 0 ? 0 : 4; i < 4; ++i) {
    wrong += differences(names[i], one.w[i], two.w[i]);
    wrong += differences(names[i], one.bias[i], two.bias[i]);
    wrong += differences(names[i], three.w[i], two.w[i]);
    wrong += differences(names[i], three.bias[i], two.bias[i]);
  }
  CHECK(wrong == 0);
  CHECK(e3.claim == e1.claim);
  // Every element moved and nothing past the arrays was written; a bias left out stays as it was.
  const Arrays<T> before(cs, seed);
  for (int i = 0; i < 4; ++i) {
    for (int64_t e = 0; e < cs.m * cs.n; ++e) wrong += two.w[i][e] == before.w[i][e] && i != 3;
    for (size_t e = cs.m * cs.n; e < two.w[i].size(); ++e) wrong += two.w[i][e] != before.w[i][e];
    for (size_t e = cs.bias ? cs.m : 0; e < two.bias[i].size(); ++e)
      wrong += one.bias[i][e] != before.bias[i][e];
  }
  CHECK(wrong == 0);
  if (cs.step >= 0) {
    CHECK(one.t[0] == two.t[0]);
    CHECK(one.t[1] == two.t[1]);
    CHECK(three.t[0] == two.t[0]);
    CHECK(three.t[1] == two.t[1]);
    CHECK(one.t[0] == cs.step + 1);
    CHECK(one.t[1] == (cs.bias ? cs.step + 1 : cs.step));
    CHECK(e1.claim == 0u);
  } else {
    // Reported by both, each as its own op's: the fused step's weight is parameter 0, as the
    // update's first group.
    CHECK(e1.claim == 1u);
    CHECK(e2.claim == 1u);
    CHECK(e1.kind() == e2.kind());
    CHECK(e1.kind() == static_cast<long long>(cuda::DeviceErrorKind::StepCount));
    CHECK(e1.op() == static_cast<long long>(Op::WeightGradAdam));
    CHECK(e2.op() == static_cast<long long>(Op::AdamUpdate));
  }
  CHECK(e1.claim == e2.claim);
}

}  // namespace

TEST_CASE(
    "the weight-gradient GEMM kernel that updates its parameters gives the bits of the product "
    "and Adam kernels (emulated)",
    "[nvrtc][emulated][small_gemm]") {
  // One row a thread (under 16,384 outputs) or four, one column block or several, rows past the
  // weight's edge in the last row block, k in one chunk or several, more bias elements than a
  // block's threads.
  const std::vector<Case> cases = {
      {1, 1, 1},
      {10, 100, 32},
      {10, 100, 32, false},
      {100, 100, 32, true, true, 0.01, 5},
      {100, 784, 32, true, false, 0.1, 2},    // four rows a thread, seven column blocks
      {66, 260, 300},                         // k over several chunks
      {300, 60, 7, true, false, 0, 1, 1, 3},  // b not aligned for vectors
      {5, 7, 3, false, true, 0.5, 1000},
      {12, 16, 10, true, false, 0, -1},  // a count the counter cannot keep
  };
  uint32_t seed = 1;
  for (const Case& cs : cases) {
    check<float>(cs, seed++);
    check<double>(cs, seed++);
  }
}
