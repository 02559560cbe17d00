// 2-D convolution on CUDA through cuDNN 9 (its convolution API): forward, input gradient and
// weight gradient, with the semantics of kernels/cpu/conv.cc (NCHW cross-correlation, stride,
// zero padding, dilation, groups; float32 and float64).
//
// - The cuDNN handle and workspace of the current stream (stream_libraries.h): no lock, and two
//   streams never share a workspace.
// - A plan per (device, op, dtype, shapes, attributes) holds the descriptors and an algorithm
//   chosen once from cuDNN's heuristics (cudnnGet*Algorithm_v7: the same list in the same order
//   for the same GPU, cuDNN version and shapes, where timing with cudnnFind* could pick another
//   algorithm in another process, with other bits): the first that is deterministic, on float32
//   uses no tensor-core math, and asks for a workspace of at most 256 MiB (a fixed bound, never
//   the memory free: an algorithm whose workspace cannot be had fails with an Error rather than
//   another one running). A replay then gives the eager run's bits, and two processes on one kind
//   of GPU give the same bits (PyTorch's deterministic mode chooses the same way). Plans live as
//   long as the process, found by key under a lock; a static plan's step keeps its plan in its
//   KernelArgs::state, so a replay looks nothing up.
// - cuDNN's descriptors count in int: where x or y has more elements than an int holds, the
//   convolution runs as several calls over consecutive samples of the batch, each of at most
//   2^28 elements where a sample allows (a weight gradient adds the later calls' into the
//   first's), as PyTorch splits it. One plan holds
//   the descriptors of both call sizes, so a replay still looks nothing up.
// - A stream's workspace grows (cudaMalloc, the caching allocator's cache emptied if the device
//   is out of memory) when a plan needs more. A buffer it outgrows is kept, never freed: a
//   captured CUDA graph may still point at it.
// - While the thread captures a CUDA graph, no plan is made and nothing allocated: a missing plan
//   defers the capture (cuda::NotReadyForCapture; the phase replays on the stream, which makes
//   it, and the next call captures), and a handle not yet created throws Error (a failed
//   capture).
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/plan_cache.h"
#include "kernels/cuda/stream_libraries.h"

namespace encore::kernels::cuda {
namespace {

enum class Kind : int32_t { Forward, GradInput, GradWeight };

// One convolution as its kernel sees it: the op, which of the three it is, the dtype, and the
// shapes in the forward roles (for the gradients: gx's shape as x, gw's as w, gy's as y).
struct Conv {
  Op op;
  Kind kind;
  DType dtype;
  const Shape &x, &w, &y;
  const Conv2dAttrs& a;
};

// "x [2,3,8,8], weight [4,3,3,3], y [2,4,6,6], float32, stride 1x1, padding 0x0, dilation 1x1,
// groups 1".
std::string describe(const Conv& c) {
  const Conv2dAttrs& a = c.a;
  return cat("x ", c.x, ", weight ", c.w, ", y ", c.y, ", ", c.dtype, ", stride ", a.stride[0], "x",
             a.stride[1], ", padding ", a.padding[0], "x", a.padding[1], ", dilation ",
             a.dilation[0], "x", a.dilation[1], ", groups ", a.groups);
}

// Names the op, the call, the convolution and cuDNN's status, with cuDNN's own account of the
// failure where it keeps one (cudnnGetLastErrorString: the thread's last error, e.g. which
// descriptor field it refused).
[[noreturn]] void fail_cudnn(const Conv& c, const char* call, cudnnStatus_t s) {
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof detail);
  fail(op_name(c.op), ": cuDNN error in ", call, " for ", describe(c), ": ", cudnnGetErrorString(s),
       " (status ", static_cast<int>(s), ")", detail[0] != '\0' ? ": " : "", detail);
}

#define ENCORE_CUDNN_OK(conv, call)                     \
  do {                                                  \
    const cudnnStatus_t encore_s_ = (call);             \
    if (encore_s_ != CUDNN_STATUS_SUCCESS) [[unlikely]] \
      fail_cudnn((conv), #call, encore_s_);             \
  } while (0)

// The descriptors of one convolution and the algorithm chosen for it, for `batch` samples: all of
// them, or (split) as many as keep x and y within an int, `rest` then holding the last call's
// where `batch` does not divide the batch.
struct Plan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  int algo = 0;          // a cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t
  size_t workspace = 0;  // bytes the algorithm needs
  int64_t batch = 0;     // samples per call
  std::unique_ptr<Plan> rest;
  size_t reserve = 0;  // the largest workspace of this plan and rest

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (x != nullptr) cudnnDestroyTensorDescriptor(x);
    if (y != nullptr) cudnnDestroyTensorDescriptor(y);
    if (bias != nullptr) cudnnDestroyTensorDescriptor(bias);
    if (w != nullptr) cudnnDestroyFilterDescriptor(w);
    if (conv != nullptr) cudnnDestroyConvolutionDescriptor(conv);
  }
};

// device, kind, dtype, x[4], w[4], y[4], stride[2], padding[2], dilation[2], groups.
using Key = std::array<int64_t, 22>;

PlanCache<Key, Plan>& plans() {
  static auto* cache = new PlanCache<Key, Plan>;  // never destroyed (plan_cache.h)
  return *cache;
}

cudnnDataType_t data_type(DType dt) {
  return dt == DType::Float64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
}

// A dimension of a shape whose element count fits an int (samples_per_call).
int dim(const Shape& s, int i) {
  return static_cast<int>(s[i]);
}

// s with n samples (its first dimension n).
Shape with_batch(const Shape& s, int64_t n) {
  Shape out = s;
  out.set(0, n);
  return out;
}

// The elements of x or y a call of a split convolution takes at most (PyTorch's bound): well
// within int, and a part whose deterministic algorithms' workspaces stay near an unsplit
// convolution's.
constexpr int64_t kSplitCallElements = int64_t{1} << 28;

// How many samples one cuDNN call takes: all of them where x and y hold at most INT_MAX elements,
// else as many as keep both within kSplitCallElements (at least one). Fails where one sample, or
// the weight, has more than INT_MAX.
int64_t samples_per_call(const Conv& c) {
  const int64_t n = c.x[0];
  if (std::max(c.x.numel(), c.y.numel()) <= INT_MAX && c.w.numel() <= INT_MAX) return n;
  const int64_t per_sample = std::max({c.x.numel() / n, c.y.numel() / n, int64_t{1}});
  if (per_sample > INT_MAX || c.w.numel() > INT_MAX)
    fail(op_name(c.op), ": ", describe(c), ": one sample of x or y, or the weight, has more than ",
         INT_MAX, " elements, more than cuDNN's descriptors count");
  return std::clamp<int64_t>(kSplitCallElements / per_sample, 1, n);
}

// The largest workspace an algorithm may ask for: a fixed bound, so that the choice depends on the
// shapes, the GPU and the cuDNN release only, never on the memory free at the first call.
constexpr size_t kMaxConvWorkspace = size_t{256} << 20;

// The first algorithm in cuDNN's heuristic order that it supports, is deterministic, (float32)
// does not use tensor-core math, and asks for at most kMaxConvWorkspace bytes. False when there
// is none.
template <typename Perf, typename SizeFn>
bool choose(const Perf* perf, int count, bool fp32, SizeFn&& workspace_size, Plan& plan) {
  for (int i = 0; i < count; ++i) {
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.determinism != CUDNN_DETERMINISTIC) continue;
    if (fp32 &&
        (p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION))
      continue;
    size_t bytes = 0;
    if (workspace_size(p.algo, &bytes) != CUDNN_STATUS_SUCCESS) continue;
    bytes = std::max(bytes, p.memory);
    if (bytes > kMaxConvWorkspace) continue;
    plan.algo = static_cast<int>(p.algo);
    plan.workspace = bytes;
    return true;
  }
  return false;
}

// Builds the descriptors of a convolution of `batch` samples (a whole call's) and chooses its
// algorithm (eager only).
std::unique_ptr<Plan> make_call_plan(const Conv& whole, int64_t batch, StreamLibraries& libs) {
  const Shape xs = with_batch(whole.x, batch), ys = with_batch(whole.y, batch);
  const Shape& ws = whole.w;
  const Conv c{whole.op, whole.kind, whole.dtype, xs, ws, ys, whole.a};
  const Kind kind = c.kind;
  const Conv2dAttrs& a = c.a;
  auto plan = std::make_unique<Plan>();
  Plan& p = *plan;
  p.batch = batch;
  const cudnnHandle_t h = libs.dnn;
  const cudnnDataType_t dt = data_type(c.dtype);
  ENCORE_CUDNN_OK(c, cudnnCreateTensorDescriptor(&p.x));
  ENCORE_CUDNN_OK(c, cudnnSetTensor4dDescriptor(p.x, CUDNN_TENSOR_NCHW, dt, dim(xs, 0), dim(xs, 1),
                                                dim(xs, 2), dim(xs, 3)));
  ENCORE_CUDNN_OK(c, cudnnCreateTensorDescriptor(&p.y));
  ENCORE_CUDNN_OK(c, cudnnSetTensor4dDescriptor(p.y, CUDNN_TENSOR_NCHW, dt, dim(ys, 0), dim(ys, 1),
                                                dim(ys, 2), dim(ys, 3)));
  ENCORE_CUDNN_OK(c, cudnnCreateFilterDescriptor(&p.w));
  ENCORE_CUDNN_OK(c, cudnnSetFilter4dDescriptor(p.w, dt, CUDNN_TENSOR_NCHW, dim(ws, 0), dim(ws, 1),
                                                dim(ws, 2), dim(ws, 3)));
  if (kind == Kind::Forward) {
    ENCORE_CUDNN_OK(c, cudnnCreateTensorDescriptor(&p.bias));
    ENCORE_CUDNN_OK(c,
                    cudnnSetTensor4dDescriptor(p.bias, CUDNN_TENSOR_NCHW, dt, 1, dim(ws, 0), 1, 1));
  }
  ENCORE_CUDNN_OK(c, cudnnCreateConvolutionDescriptor(&p.conv));
  ENCORE_CUDNN_OK(c, cudnnSetConvolution2dDescriptor(p.conv, a.padding[0], a.padding[1],
                                                     a.stride[0], a.stride[1], a.dilation[0],
                                                     a.dilation[1], CUDNN_CROSS_CORRELATION, dt));
  ENCORE_CUDNN_OK(c, cudnnSetConvolutionGroupCount(p.conv, a.groups));
  // float32 must not use TF32 tensor cores (10-bit mantissa products) so results stay close to
  // the CPU's. CUDNN_DEFAULT_MATH permits TF32 on sm_80 and newer; CUDNN_FMA_MATH restricts
  // cuDNN to FMA kernels (full float32). float64 keeps the default (float64 tensor cores, where
  // used, compute in full float64).
  const bool fp32 = c.dtype == DType::Float32;
  ENCORE_CUDNN_OK(c,
                  cudnnSetConvolutionMathType(p.conv, fp32 ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH));

  int max = 0, got = 0;
  bool chosen = false;
  switch (kind) {
    case Kind::Forward: {
      ENCORE_CUDNN_OK(c, cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max));
      std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<size_t>(std::max(max, 1)));
      ENCORE_CUDNN_OK(c, cudnnGetConvolutionForwardAlgorithm_v7(h, p.x, p.w, p.conv, p.y, max, &got,
                                                                perf.data()));
      chosen = choose(
          perf.data(), got, fp32,
          [&](cudnnConvolutionFwdAlgo_t algo, size_t* bytes) {
            return cudnnGetConvolutionForwardWorkspaceSize(h, p.x, p.w, p.conv, p.y, algo, bytes);
          },
          p);
      break;
    }
    case Kind::GradInput: {
      ENCORE_CUDNN_OK(c, cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max));
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(static_cast<size_t>(std::max(max, 1)));
      ENCORE_CUDNN_OK(c, cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p.w, p.y, p.conv, p.x, max,
                                                                     &got, perf.data()));
      chosen = choose(
          perf.data(), got, fp32,
          [&](cudnnConvolutionBwdDataAlgo_t algo, size_t* bytes) {
            return cudnnGetConvolutionBackwardDataWorkspaceSize(h, p.w, p.y, p.conv, p.x, algo,
                                                                bytes);
          },
          p);
      break;
    }
    case Kind::GradWeight: {
      ENCORE_CUDNN_OK(c, cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max));
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(static_cast<size_t>(std::max(max, 1)));
      ENCORE_CUDNN_OK(c, cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p.x, p.y, p.conv, p.w,
                                                                       max, &got, perf.data()));
      chosen = choose(
          perf.data(), got, fp32,
          [&](cudnnConvolutionBwdFilterAlgo_t algo, size_t* bytes) {
            return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p.x, p.y, p.conv, p.w, algo,
                                                                  bytes);
          },
          p);
      break;
    }
  }
  if (!chosen)
    fail(op_name(c.op), ": cuDNN has no deterministic algorithm (of ", got,
         " it proposes) with a workspace of at most ", kMaxConvWorkspace, " bytes for ",
         describe(c));
  return plan;
}

// The plan of a whole convolution: one call's, or (split) the full calls' with the last call's
// as its rest. Its workspace is reserved now: the algorithm is chosen whatever memory is free,
// and one that cannot have its workspace fails, rather than another algorithm (other bits)
// running.
std::unique_ptr<Plan> make_plan(const Conv& c, StreamLibraries& libs) {
  const int64_t n = c.x[0], batch = samples_per_call(c);
  std::unique_ptr<Plan> plan = make_call_plan(c, batch, libs);
  plan->reserve = plan->workspace;
  if (n % batch != 0) {
    plan->rest = make_call_plan(c, n % batch, libs);
    plan->reserve = std::max(plan->reserve, plan->rest->workspace);
  }
  if (!reserve_cudnn_workspace(libs, plan->reserve))
    fail(op_name(c.op), ": no device memory for the ", plan->reserve,
         "-byte cuDNN workspace of the algorithm chosen for ", describe(c),
         ", even after emptying the caching allocator's cache");
  return plan;
}

// The plan of this convolution, made (its algorithm chosen) on its first call; a static plan's
// step keeps it in `state`.
const Plan& plan_for(const Conv& c, std::atomic<void*>* state_slot) {
  if (state_slot != nullptr)
    if (const void* p = state_slot->load(std::memory_order_acquire); p != nullptr) [[likely]]
      return *static_cast<const Plan*>(p);
  const Key key{encore::cuda::current_device(),
                static_cast<int64_t>(c.kind),
                static_cast<int64_t>(c.dtype),
                c.x[0],
                c.x[1],
                c.x[2],
                c.x[3],
                c.w[0],
                c.w[1],
                c.w[2],
                c.w[3],
                c.y[0],
                c.y[1],
                c.y[2],
                c.y[3],
                c.a.stride[0],
                c.a.stride[1],
                c.a.padding[0],
                c.a.padding[1],
                c.a.dilation[0],
                c.a.dilation[1],
                c.a.groups};
  Plan& p = plans().find_or_make(key, [&] {
    if (encore::cuda::capturing())
      throw encore::cuda::NotReadyForCapture(cat(op_name(c.op),
                                                 ": no cuDNN algorithm chosen yet for ",
                                                 describe(c), " (chosen outside a capture)"));
    return make_plan(c, cudnn_libraries(c.op, 0));
  });
  if (state_slot != nullptr) state_slot->store(&p, std::memory_order_release);
  return p;
}

// Runs run(handle, call plan, workspace, first sample) for each cuDNN call of this convolution
// (one unless it is split), in order of the samples, with the current stream's cuDNN handle and
// workspace.
template <typename F>
void with_plan(const Conv& c, std::atomic<void*>* state_slot, F&& run) {
  const Plan& p = plan_for(c, state_slot);
  StreamLibraries& libs = cudnn_libraries(c.op, p.reserve);
  const int64_t n = c.x[0];
  for (int64_t first = 0; first < n; first += p.batch)
    run(libs.dnn, n - first >= p.batch ? p : *p.rest, libs.dnn_workspace, first);
}

// The address of sample `first` of a [N, ...] tensor's data.
template <typename T>
T* sample(const BufferView& t, int64_t first) {
  return static_cast<T*>(t.data) + first * (t.numel() / t.shape[0]);
}

// x [N,C,H,W], w [O,C/g,kh,kw], optional bias [O] -> y [N,O,Ho,Wo].
void conv2d(const KernelArgs& args) {
  const BufferView &x = args.in[0], &w = args.in[1], &y = args.out[0];
  const BufferView* bias = args.in.size() == 3 ? &args.in[2] : nullptr;
  const Conv c{Op::Conv2d, Kind::Forward,           y.dtype, x.shape, w.shape,
               y.shape,    args.attr<Conv2dAttrs>()};
  switch_floating(y.dtype, Op::Conv2d, [&]<typename T>(Type<T>) {
    if (y.numel() == 0) return;
    const T one = 1, zero = 0;
    if (x.numel() == 0) {
      // An empty image (H or W 0) padded to a non-empty output: y is the bias, or zeros.
      ENCORE_CUDA_OK(
          Op::Conv2d,
          cudaMemsetAsync(y.data, 0, static_cast<size_t>(y.numel()) * sizeof(T), stream()));
      if (bias == nullptr) return;
      if (y.numel() > INT_MAX)
        fail(op_name(Op::Conv2d), ": ", describe(c), ": y has more than ", INT_MAX,
             " elements, more than cuDNN's descriptors count");
      StreamLibraries& libs = cudnn_libraries(Op::Conv2d, 0);
      Plan p;  // descriptors only
      const cudnnDataType_t dt = data_type(y.dtype);
      ENCORE_CUDNN_OK(c, cudnnCreateTensorDescriptor(&p.y));
      ENCORE_CUDNN_OK(
          c, cudnnSetTensor4dDescriptor(p.y, CUDNN_TENSOR_NCHW, dt, dim(y.shape, 0),
                                        dim(y.shape, 1), dim(y.shape, 2), dim(y.shape, 3)));
      ENCORE_CUDNN_OK(c, cudnnCreateTensorDescriptor(&p.bias));
      ENCORE_CUDNN_OK(
          c, cudnnSetTensor4dDescriptor(p.bias, CUDNN_TENSOR_NCHW, dt, 1, dim(y.shape, 1), 1, 1));
      ENCORE_CUDNN_OK(c, cudnnAddTensor(libs.dnn, &one, p.bias, bias->data, &one, p.y, y.data));
      return;
    }
    with_plan(c, args.state, [&](cudnnHandle_t h, const Plan& p, void* workspace, int64_t first) {
      T* py = sample<T>(y, first);
      ENCORE_CUDNN_OK(
          c, cudnnConvolutionForward(h, &one, p.x, sample<T>(x, first), p.w, w.data, p.conv,
                                     static_cast<cudnnConvolutionFwdAlgo_t>(p.algo), workspace,
                                     p.workspace, &zero, p.y, py));
      if (bias != nullptr)
        ENCORE_CUDNN_OK(c, cudnnAddTensor(h, &one, p.bias, bias->data, &one, p.y, py));
    });
  });
}

// gy [N,O,Ho,Wo], w -> gx [N,C,H,W].
void conv2d_grad_input(const KernelArgs& args) {
  const BufferView &gy = args.in[0], &w = args.in[1], &gx = args.out[0];
  const Conv c{Op::Conv2dGradInput,     Kind::GradInput, gx.dtype, gx.shape, w.shape, gy.shape,
               args.attr<Conv2dAttrs>()};
  switch_floating(gx.dtype, Op::Conv2dGradInput, [&]<typename T>(Type<T>) {
    if (gx.numel() == 0) return;  // else N > 0, so gy is not empty either
    const T one = 1, zero = 0;
    with_plan(c, args.state, [&](cudnnHandle_t h, const Plan& p, void* workspace, int64_t first) {
      ENCORE_CUDNN_OK(c, cudnnConvolutionBackwardData(
                             h, &one, p.w, w.data, p.y, sample<T>(gy, first), p.conv,
                             static_cast<cudnnConvolutionBwdDataAlgo_t>(p.algo), workspace,
                             p.workspace, &zero, p.x, sample<T>(gx, first)));
    });
  });
}

// x, gy -> gw [O,C/g,kh,kw]; a split convolution's later calls add into the first's.
void conv2d_grad_weight(const KernelArgs& args) {
  const BufferView &x = args.in[0], &gy = args.in[1], &gw = args.out[0];
  const Conv c{Op::Conv2dGradWeight,    Kind::GradWeight, gw.dtype, x.shape, gw.shape, gy.shape,
               args.attr<Conv2dAttrs>()};
  switch_floating(gw.dtype, Op::Conv2dGradWeight, [&]<typename T>(Type<T>) {
    if (gw.numel() == 0) return;
    if (x.numel() == 0 || gy.numel() == 0) {  // an empty batch or image: a sum of nothing
      ENCORE_CUDA_OK(
          Op::Conv2dGradWeight,
          cudaMemsetAsync(gw.data, 0, static_cast<size_t>(gw.numel()) * sizeof(T), stream()));
      return;
    }
    const T one = 1, zero = 0;
    with_plan(c, args.state, [&](cudnnHandle_t h, const Plan& p, void* workspace, int64_t first) {
      ENCORE_CUDNN_OK(c, cudnnConvolutionBackwardFilter(
                             h, &one, p.x, sample<T>(x, first), p.y, sample<T>(gy, first), p.conv,
                             static_cast<cudnnConvolutionBwdFilterAlgo_t>(p.algo), workspace,
                             p.workspace, first == 0 ? &zero : &one, p.w, gw.data));
    });
  });
}

ENCORE_REGISTER_CUDA(Op::Conv2d, conv2d);
ENCORE_REGISTER_CUDA(Op::Conv2dGradInput, conv2d_grad_input);
ENCORE_REGISTER_CUDA(Op::Conv2dGradWeight, conv2d_grad_weight);

}  // namespace
}  // namespace encore::kernels::cuda
