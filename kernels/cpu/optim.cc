// Optimizer updates, in place and fused: one pass over the parameter and its state. Scalars
// are computed once in double and applied in the parameter's dtype. A call takes one group of
// inputs per parameter (op_traits.h); the groups are updated one after another.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <utility>

#include "kernels/cpu/kernel.h"
#include "kernels/cpu/optim.h"
#include "kernels/cpu/simd.h"
#include "kernels/update_groups.h"
#include "runtime/comm_progress.h"
#include "runtime/parallel.h"

namespace encore::kernels::cpu {
namespace {

// Elements per thread below which an update runs on the calling thread alone.
constexpr int64_t kParallelGrain = int64_t{1} << 14;
// Elements between two progress polls while communication is in flight (about 0.1 ms of Adam).
constexpr int64_t kProgressSlice = int64_t{1} << 16;

// body(begin, end) over the elements [0, n), split across cores as parallel_for splits it. While
// this thread has communication in flight (a data-parallel step's all-reduces, which advance
// only inside MPI calls: runtime/comm_progress.h), in slices with a poll between them, so the
// all-reduce of the next bucket advances during a large parameter's update instead of waiting
// for it. Elementwise, so the bits do not depend on the slices.
template <typename Body>
void update_for(int64_t n, Body body) {
  if (!comm_progress::in_flight()) {
    parallel_for(n, kParallelGrain, std::move(body));
    return;
  }
  for (int64_t begin = 0; begin < n; begin += kProgressSlice) {
    const int64_t end = std::min(n, begin + kProgressSlice);
    parallel_for(end - begin, kParallelGrain,
                 [&body, begin](int64_t b, int64_t e) { body(begin + b, begin + e); });
    comm_progress::poll();
  }
}

// Calls update(group) for each parameter's group of inputs of an optimizer update, once all are
// checked (kernels/update_groups.h).
template <typename Update>
void for_each_group(const KernelArgs& args, Op op, Update update) {
  check_update_groups(args.in, op);
  const size_t group = static_cast<size_t>(op_input_group(op));
  for (size_t k = 0; k + group <= args.in.size(); k += group) update(args.in.subspan(k, group));
}

// p -= lr * (g + wd * p).
void sgd_one(std::span<const BufferView> in, const KernelArgs& args) {
  const BufferView &p = in[0], &g = in[1];
  const SgdAttrs& a = args.attr<SgdAttrs>();
  switch_floating(p.dtype, Op::SgdUpdate, [&]<typename T>(Type<T>) {
    T* pp = p.as<T>();
    const T* pg = g.as<T>();
    const T lr = static_cast<T>(a.lr), wd = static_cast<T>(a.weight_decay);
    if (a.weight_decay == 0) {
      update_for(p.numel(), [=](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) pp[i] -= lr * pg[i];
      });
    } else {
      update_for(p.numel(), [=](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) pp[i] -= lr * (pg[i] + wd * pp[i]);
      });
    }
  });
}

// v = momentum * v - lr * (g + wd * p); p += v.
void momentum_sgd_one(std::span<const BufferView> in, const KernelArgs& args) {
  const BufferView &p = in[0], &g = in[1], &v = in[2];
  const SgdAttrs& a = args.attr<SgdAttrs>();
  switch_floating(p.dtype, Op::MomentumSgdUpdate, [&]<typename T>(Type<T>) {
    T* pp = p.as<T>();
    const T* pg = g.as<T>();
    T* pv = v.as<T>();
    const T lr = static_cast<T>(a.lr), mu = static_cast<T>(a.momentum),
            wd = static_cast<T>(a.weight_decay);
    update_for(p.numel(), [=](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const T vi = mu * pv[i] - lr * (pg[i] + wd * pp[i]);
        pv[i] = vi;
        pp[i] += vi;
      }
    });
  });
}

}  // namespace

// Adam / AdamW with PyTorch's formula; in: p, g, m, v, t (int64 step, incremented first).
void adam_update(std::span<const BufferView> in, const AdamAttrs& a) {
  const BufferView &p = in[0], &g = in[1], &m = in[2], &v = in[3];
  const BufferView& step = in[4];
  switch_floating(p.dtype, Op::AdamUpdate, [&]<typename T>(Type<T>) {
    int64_t& t = *step.as<int64_t>();
    t += 1;
    const double bc1 = 1 - std::pow(a.beta1, static_cast<double>(t));
    const double bc2 = 1 - std::pow(a.beta2, static_cast<double>(t));
    const T step_size = static_cast<T>(a.lr / bc1);
    // sqrt(v) / sqrt(bc2) as a product: one division per element instead of two (they bound
    // the loop's throughput); differs from PyTorch's expression in the last bit at most.
    const T inv_sqrt_bc2 = static_cast<T>(1 / std::sqrt(bc2));
    const T b1 = static_cast<T>(a.beta1), b2 = static_cast<T>(a.beta2);
    const T c1 = static_cast<T>(1 - a.beta1), c2 = static_cast<T>(1 - a.beta2);
    const T eps = static_cast<T>(a.eps);
    // Decoupled: p *= 1 - lr*wd and g is used as is; coupled: g' = g + wd*p.
    const T decay = static_cast<T>(a.decoupled ? 1 - a.lr * a.weight_decay : 1);
    const T wd = static_cast<T>(a.decoupled ? 0 : a.weight_decay);
    T* pp = p.as<T>();
    const T* pg = g.as<T>();
    T* pm = m.as<T>();
    T* pv = v.as<T>();
    // Memory-bound on large parameters: split across cores (elementwise, so bit-identical at
    // any thread count and in any slices), and within a thread in chunks that stay in L1 so the
    // sqrt between the two passes runs as SIMD. Captures by value: values read through a reference
    // to the enclosing frame might alias the arrays, which stops the loops from vectorizing.
    update_for(p.numel(), [=](int64_t begin, int64_t end) {
      constexpr int64_t kChunk = 512;
      T root[kChunk];
      for (int64_t c = begin; c < end; c += kChunk) {
        const int64_t w = std::min(kChunk, end - c);
        T* pc = pp + c;
        const T* gc = pg + c;
        T* mc = pm + c;
        T* vc = pv + c;
        for (int64_t i = 0; i < w; ++i) {
          const T gi = gc[i] + wd * pc[i];
          mc[i] = b1 * mc[i] + c1 * gi;
          vc[i] = b2 * vc[i] + c2 * gi * gi;
        }
        sqrt_array(vc, root, w);
        for (int64_t i = 0; i < w; ++i)
          pc[i] = pc[i] * decay - step_size * mc[i] / (root[i] * inv_sqrt_bc2 + eps);
      }
    });
  });
}

namespace {

void sgd_kernel(const KernelArgs& args) {
  for_each_group(args, Op::SgdUpdate, [&](std::span<const BufferView> in) { sgd_one(in, args); });
}
void momentum_sgd_kernel(const KernelArgs& args) {
  for_each_group(args, Op::MomentumSgdUpdate,
                 [&](std::span<const BufferView> in) { momentum_sgd_one(in, args); });
}

void adam_kernel(const KernelArgs& args) {
  const AdamAttrs& a = args.attr<AdamAttrs>();
  for_each_group(args, Op::AdamUpdate, [&](std::span<const BufferView> in) { adam_update(in, a); });
}

[[maybe_unused]] const bool kRegistered = [] {
  register_kernel(Op::SgdUpdate, DeviceType::CPU, &sgd_kernel);
  register_kernel(Op::MomentumSgdUpdate, DeviceType::CPU, &momentum_sgd_kernel);
  register_kernel(Op::AdamUpdate, DeviceType::CPU, &adam_kernel);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cpu
