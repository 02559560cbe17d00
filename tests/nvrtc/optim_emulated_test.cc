// The optimizer update kernels (kernels/cuda/optim.cuh) run on the host (emulated_kernel.h: each
// CUDA thread a fiber, blocks one after another) over optim.cu's launch tables, against the
// update computed here in double: 50 parameters of a dtype, so two launches (48 a launch), empty
// ones among them, others over many blocks; SGD with and without weight decay, momentum, Adam and
// AdamW from several step counts; the grids launched with blocks of 256 threads, as optim.cu does,
// and of 32 (the same blocks, so each thread takes several elements of its grid-stride loop). Every
// parameter moves exactly once and its step count by one; a negative count is reported with the
// parameter's index in the call. Each update runs twice, with its attributes as the kernel's
// argument and read from where a static plan's graph writes them (KernelArgs::device_attrs: the
// argument then holds other values), with the same bits. The [cuda] optimizer tests check the
// updates against the CPU's on a device.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
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
using namespace encore;
using namespace encore::kernels::cuda;
// optim.cu's launches over the groups of `in` (n buffers), with blocks of `threads`; returns the
// launches. `live`: the kernels read the attributes through their pointer, and get attributes of
// other values as their argument.
template <typename T>
int update(Op op, const BufferView* in, long long n, const SgdAttrs& sgd, const AdamAttrs& adam,
           bool live, encore::cuda::DeviceErrorSlot errors, int threads) {
  const std::span<const BufferView> args(in, n);
  const SgdAttrs other_sgd{.lr = 7, .momentum = 0.5, .weight_decay = 3};
  const AdamAttrs other_adam{.lr = 7, .beta1 = 0.5, .beta2 = 0.5, .eps = 1, .weight_decay = 3};
  const SgdAttrs& sgd_arg = live ? other_sgd : sgd;
  const AdamAttrs& adam_arg = live ? other_adam : adam;
  const SgdAttrs* sgd_at = live ? &sgd : nullptr;
  const AdamAttrs* adam_at = live ? &adam : nullptr;
  int launches = 0;
  if (op == Op::SgdUpdate)
    for_each_launch<Op::SgdUpdate>(args, [&](const TensorTable<2>& tab, const Counters&, unsigned blocks) {
      ++launches;
      emulate_launch(blocks, threads, [&] { sgd_kernel<T>(tab, sgd_arg, sgd_at); });
    });
  if (op == Op::MomentumSgdUpdate)
    for_each_launch<Op::MomentumSgdUpdate>(args, [&](const TensorTable<3>& tab, const Counters&, unsigned blocks) {
      ++launches;
      emulate_launch(blocks, threads, [&] { momentum_sgd_kernel<T>(tab, sgd_arg, sgd_at); });
    });
  if (op == Op::AdamUpdate)
    for_each_launch<Op::AdamUpdate>(args, [&](const TensorTable<4>& tab, const Counters& c, unsigned blocks) {
      ++launches;
      emulate_launch(blocks, threads, [&] { adam_kernel<T>(tab, c, adam_arg, adam_at, errors); });
    });
  return launches;
}
extern "C" int update_f32(int op, const BufferView* in, long long n, const SgdAttrs* sgd,
                          const AdamAttrs* adam, int live, encore::cuda::DeviceErrorSlot errors,
                          int threads) {
  return update<float>(static_cast<Op>(op), in, n, *sgd, *adam, live != 0, errors, threads);
}
extern "C" int update_f64(int op, const BufferView* in, long long n, const SgdAttrs* sgd,
                          const AdamAttrs* adam, int live, encore::cuda::DeviceErrorSlot errors,
                          int threads) {
  return update<double>(static_cast<Op>(op), in, n, *sgd, *adam, live != 0, errors, threads);
}
)cuda";

using Update = int (*)(int, const BufferView*, long long, const SgdAttrs*, const AdamAttrs*, int,
                       cuda::DeviceErrorSlot, int);

// Threads per block: optim.cu's, and fewer (each thread then updates several elements).
constexpr int kLaunchThreads = 256, kFewThreads = 32;

template <typename T>
Update update_entry() {
  static const testing::HostObject object({}, kSource);
  return object.function<Update>(testing::typed_name<T>("update"));
}

// One parameter's arrays (p, g, then the state the op keeps) and Adam's step count.
template <typename T>
struct Param {
  std::vector<std::vector<T>> arrays;
  int64_t t = 0;
};

constexpr int kParams = 50;

// Element counts: empty ones, one element, and some over many blocks of 256 threads.
int64_t size_of(int k) {
  const int64_t sizes[] = {0, 1, 300, 5000, 37, 256, 257};
  return sizes[k % 7] + (k > 40 ? 3 : 0);
}

template <typename T>
std::vector<Param<T>> make_params(int arrays, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(-1, 1), pos(0, 1);
  std::vector<Param<T>> params(kParams);
  for (int k = 0; k < kParams; ++k) {
    params[k].arrays.resize(arrays);
    for (int a = 0; a < arrays; ++a)
      for (int64_t i = 0; i < size_of(k); ++i)
        params[k].arrays[a].push_back(static_cast<T>(a == 3 ? pos(rng) : u(rng)));  // v >= 0
    params[k].t = k % 3 == 0 ? 0 : k;
  }
  return params;
}

// The buffers of a call: each parameter's group (its arrays, and Adam's counter).
template <typename T>
std::vector<BufferView> views(std::vector<Param<T>>& params, bool counter) {
  std::vector<BufferView> in;
  const DType dtype = std::is_same_v<T, float> ? DType::Float32 : DType::Float64;
  for (Param<T>& p : params) {
    for (std::vector<T>& a : p.arrays)
      in.push_back({a.data(), Shape{static_cast<int64_t>(a.size())}, dtype});
    if (counter) in.push_back({&p.t, Shape{1}, DType::Int64});
  }
  return in;
}

template <typename T>
bool near(double got, double want, double magnitude) {
  return testing::within_ulps<T>(got, want, magnitude, 16);
}

// Runs `op` over `params` with the attributes as the kernels' argument, and over a copy with them
// read through the kernels' pointer: the same bits, the same counts, no error reported.
template <typename T>
void update_both_ways(Op op, std::vector<Param<T>>& params, const SgdAttrs& sgd,
                      const AdamAttrs& adam, int threads) {
  std::vector<Param<T>> through_pointer = params;
  const bool counter = op == Op::AdamUpdate;
  for (const int live : {0, 1}) {
    INFO((live ? "attributes read through the pointer" : "attributes as the argument"));
    std::vector<BufferView> in = views(live ? through_pointer : params, counter);
    testing::HostErrorSlot errors;
    CHECK(update_entry<T>()(static_cast<int>(op), in.data(), static_cast<long long>(in.size()),
                            &sgd, &adam, live, errors.slot(), threads) == 2);
    CHECK(errors.claim == 0);
  }
  int64_t differ = 0;
  for (int k = 0; k < kParams; ++k) {
    differ += params[k].t != through_pointer[k].t;
    for (size_t a = 0; a < params[k].arrays.size(); ++a)
      differ += std::memcmp(params[k].arrays[a].data(), through_pointer[k].arrays[a].data(),
                            params[k].arrays[a].size() * sizeof(T)) != 0;
  }
  CHECK(differ == 0);
}

template <typename T>
void check_sgd(bool momentum, double wd, int threads, std::mt19937& rng) {
  INFO((momentum ? "momentum SGD" : "SGD") << ", weight decay " << wd << ", " << sizeof(T) * 8
                                           << "-bit, " << threads << " threads a block");
  std::vector<Param<T>> params = make_params<T>(momentum ? 3 : 2, rng);
  const std::vector<Param<T>> before = params;
  const SgdAttrs sgd{0.1, momentum ? 0.9 : 0.0, wd};
  update_both_ways(momentum ? Op::MomentumSgdUpdate : Op::SgdUpdate, params, sgd, AdamAttrs{},
                   threads);
  int64_t wrong = 0;
  for (int k = 0; k < kParams; ++k)
    for (int64_t i = 0; i < size_of(k); ++i) {
      const double p = before[k].arrays[0][i], g = before[k].arrays[1][i];
      double want = p - sgd.lr * (g + wd * p);
      if (momentum) {
        const double v = sgd.momentum * before[k].arrays[2][i] - sgd.lr * (g + wd * p);
        wrong += !near<T>(params[k].arrays[2][i], v, 2);
        want = p + v;
      }
      wrong += !near<T>(params[k].arrays[0][i], want, 2);
    }
  CHECK(wrong == 0);
}

template <typename T>
void check_adam(bool decoupled, int threads, std::mt19937& rng) {
  INFO((decoupled ? "AdamW" : "Adam")
       << ", " << sizeof(T) * 8 << "-bit, " << threads << " threads a block");
  std::vector<Param<T>> params = make_params<T>(4, rng);
  const std::vector<Param<T>> before = params;
  const SgdAttrs sgd;
  AdamAttrs adam;
  adam.lr = 0.01;
  adam.weight_decay = 0.1;
  adam.decoupled = decoupled;
  update_both_ways(Op::AdamUpdate, params, sgd, adam, threads);
  int64_t wrong = 0;
  for (int k = 0; k < kParams; ++k) {
    INFO("parameter " << k);
    CHECK(params[k].t == before[k].t + 1);  // counted once, empty parameters too
    const double steps = static_cast<double>(before[k].t + 1);
    const double bc1 = 1 - std::pow(adam.beta1, steps), bc2 = 1 - std::pow(adam.beta2, steps);
    for (int64_t i = 0; i < size_of(k); ++i) {
      const std::vector<std::vector<T>>& b = before[k].arrays;
      const double p = b[0][i], g = b[1][i] + (decoupled ? 0 : adam.weight_decay * p);
      const double m = adam.beta1 * b[2][i] + (1 - adam.beta1) * g;
      const double v = adam.beta2 * b[3][i] + (1 - adam.beta2) * g * g;
      const double decay = decoupled ? 1 - adam.lr * adam.weight_decay : 1;
      const double step = adam.lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + adam.eps);
      wrong += !near<T>(params[k].arrays[2][i], m, 2) + !near<T>(params[k].arrays[3][i], v, 2);
      wrong += !near<T>(params[k].arrays[0][i], p * decay - step, 2 + std::abs(step));
    }
  }
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("SGD and momentum update every parameter of two launches once (emulated)",
          "[nvrtc][emulated]") {
  std::mt19937 rng(31);
  for (const int threads : {kLaunchThreads, kFewThreads})
    for (const double wd : {0.0, 0.01}) {
      check_sgd<float>(false, wd, threads, rng);
      check_sgd<double>(true, wd, threads, rng);
    }
}

TEST_CASE("Adam and AdamW count each parameter's step once and update it with it (emulated)",
          "[nvrtc][emulated]") {
  std::mt19937 rng(37);
  for (const int threads : {kLaunchThreads, kFewThreads})
    for (const bool decoupled : {false, true}) {
      check_adam<float>(decoupled, threads, rng);
      check_adam<double>(decoupled, threads, rng);
    }
}

TEST_CASE("a negative Adam step count is reported with its parameter's index (emulated)",
          "[nvrtc][emulated]") {
  std::mt19937 rng(41);
  for (const int bad : {3, 45, 49}) {  // the first launch, its last parameters, the second launch
    INFO("parameter " << bad);
    std::vector<Param<float>> params = make_params<float>(4, rng);
    params[bad].t = -2;
    std::vector<BufferView> in = views(params, true);
    const SgdAttrs sgd;
    const AdamAttrs adam;
    testing::HostErrorSlot errors;
    update_entry<float>()(static_cast<int>(Op::AdamUpdate), in.data(),
                          static_cast<long long>(in.size()), &sgd, &adam, 0, errors.slot(),
                          kLaunchThreads);
    CHECK(errors.claim == 1);
    CHECK(errors.kind() == static_cast<long long>(cuda::DeviceErrorKind::StepCount));
    CHECK(errors.op() == static_cast<long long>(Op::AdamUpdate));
    CHECK(errors.record[1] == -1);
    CHECK(errors.record[2] == bad);
  }
}
