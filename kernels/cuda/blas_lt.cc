// Linear with a bias on cuBLASLt (blas.h: linear_bias_lt): y = x w^T + bias as one
// cublasLtMatmul whose epilogue adds the bias. blas.cu's general path fills y with the bias and
// then runs a GEMM that adds to it: one kernel and one pass over y more.
//
// - A plan per (device, dtype, m, n, k) and alignment holds the matrix layouts and the algorithm:
//   the first cuBLASLt's heuristic proposes within the stream's workspace (kWorkspaceBytes), with
//   CUBLAS_COMPUTE_32F for float32 (no TF32, as cuBLAS's default math) and CUBLAS_COMPUTE_64F for
//   float64. Each of cuBLASLt's split-K reductions is deterministic (the in-place one orders the
//   parts with counters), and eager calls and replays share plans, so a replay gives its eager
//   run's bits.
// - The alignment is the largest power of two, up to 256 bytes, that divides the address of every
//   operand; the heuristic is told it (the MIN_ALIGNMENT preferences, and a bias address of that
//   alignment), so the algorithm runs at it. A static step keeps its shape's plans (one per
//   alignment) in KernelArgs::state and finds the one of its operands' alignment there (one load,
//   no lock, no lookup); eager calls look theirs up, so both run the same algorithm at every
//   alignment.
// - Plans live as long as the process and are made eagerly, under a lock, never during graph
//   capture: a capture that needs a plan not made yet is deferred (cuda::NotReadyForCapture) and
//   its stream replay makes it. Where cuBLASLt has no algorithm, the plan says so and the caller
//   takes the general path (lt_plan_counts() counts such plans).
// - ENCORE_CUDA_LT=0 sends every linear down the general path (to compare the two).
#include <cublasLt.h>

#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "kernels/cuda/blas.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/plan_cache.h"
#include "kernels/cuda/stream_libraries.h"
#include "runtime/env.h"

namespace encore::kernels::cuda {
namespace {

constexpr uintptr_t kMaxAlign = 256;

struct LtPlan {
  bool usable = false;  // cuBLASLt proposed an algorithm
  uint32_t align = 0;   // the alignment it was chosen for
  cublasLtMatrixLayoutOpaque_t w{}, x{}, y{};
  cublasLtMatmulAlgo_t algo{};
};

// The plans of one linear shape, one per operand alignment (1, 2, 4, ... 256 bytes), each
// published once made. A static step keeps its shape's in its KernelArgs::state and finds the
// plan of any alignment there with one load: no lock, no lookup.
struct LtShape {
  static constexpr int kAlignments = 9;                    // log2(kMaxAlign) + 1
  std::mutex mu;                                           // making a plan
  std::array<std::unique_ptr<LtPlan>, kAlignments> owned;  // under mu
  std::array<std::atomic<const LtPlan*>, kAlignments> ready{};
};

// device, dtype, m, n, k.
using LtKey = std::array<int64_t, 5>;

PlanCache<LtKey, LtShape>& shapes() {
  static auto* cache = new PlanCache<LtKey, LtShape>;  // never destroyed (plan_cache.h)
  return *cache;
}

// The largest power of two up to kMaxAlign dividing every address.
uint32_t alignment_of(const void* x, const void* w, const void* bias, const void* y) {
  const uintptr_t bits = kMaxAlign | reinterpret_cast<uintptr_t>(x) |
                         reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(bias) |
                         reinterpret_cast<uintptr_t>(y);
  return static_cast<uint32_t>(bits & (~bits + 1));
}

cudaDataType_t data_type(DType dt) {
  return dt == DType::Float64 ? CUDA_R_64F : CUDA_R_32F;
}

// The matmul description: y^T = op(w^T) x^T + bias in cuBLAS's column-major terms (blas.cu), the
// bias (a vector over y^T's rows, the out features) added by the epilogue.
cublasStatus_t describe(cublasLtMatmulDescOpaque_t& storage, DType dt, const void* bias) {
  const cublasLtMatmulDesc_t desc = &storage;
  const bool f64 = dt == DType::Float64;
  if (auto st = cublasLtMatmulDescInit(desc, f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F,
                                       data_type(dt));
      st != CUBLAS_STATUS_SUCCESS)
    return st;
  const int32_t trans_w = CUBLAS_OP_T, trans_x = CUBLAS_OP_N;
  const uint32_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  if (auto st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_w,
                                               sizeof(trans_w));
      st != CUBLAS_STATUS_SUCCESS)
    return st;
  if (auto st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_x,
                                               sizeof(trans_x));
      st != CUBLAS_STATUS_SUCCESS)
    return st;
  if (auto st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                               sizeof(epilogue));
      st != CUBLAS_STATUS_SUCCESS)
    return st;
  return cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                        sizeof(bias));
}

// "x [33,70], weight [29,70], bias [29], float32, operands aligned to 4 bytes".
std::string operands(const GemmShape& g, DType dt, uint32_t align) {
  return cat("x [", g.m, ",", g.k, "], weight [", g.n, ",", g.k, "], bias [", g.n, "], ", name(dt),
             ", operands aligned to ", align, " bytes");
}

[[noreturn]] void fail_lt(Op op, const char* call, cublasStatus_t st, const GemmShape& g, DType dt,
                          uint32_t align) {
  fail(op_name(op), ": cuBLASLt error in ", call, " for ", operands(g, dt, align), ": ",
       cublasGetStatusName(st), " (", cublasGetStatusString(st), ")");
}

std::mutex g_counts_mu;
LtPlanCounts g_counts;  // under g_counts_mu

// Chooses the algorithm of a plan (eagerly). Where cuBLASLt has none for it, returns why (the
// heuristic says NOT_SUPPORTED, or INVALID_VALUE, which cublasLt.h documents only for a bad
// request count and which is kept visible here rather than raised, or it proposes nothing
// usable), and an empty string once p.algo is chosen; any other failure is a bug of ours or the
// library's, and raises.
std::string choose(Op op, cublasLtHandle_t lt, const GemmShape& g, DType dt, const void* bias,
                   LtPlan& p) {
  const cudaDataType_t type = data_type(dt);
  auto ok = [&](cublasStatus_t st, const char* call) {
    if (st != CUBLAS_STATUS_SUCCESS) fail_lt(op, call, st, g, dt, p.align);
  };
  // Column-major: w^T [k, n] (transposed by the op), x^T [k, m], y^T [n, m].
  ok(cublasLtMatrixLayoutInit(&p.w, type, g.k, g.n, g.ldb), "cublasLtMatrixLayoutInit (weight)");
  ok(cublasLtMatrixLayoutInit(&p.x, type, g.k, g.m, g.lda), "cublasLtMatrixLayoutInit (x)");
  ok(cublasLtMatrixLayoutInit(&p.y, type, g.n, g.m, g.ldc), "cublasLtMatrixLayoutInit (y)");
  // The heuristic reads the bias address for its alignment only: one of exactly p.align.
  const uintptr_t at = reinterpret_cast<uintptr_t>(bias);
  const void* aligned_bias = reinterpret_cast<const void*>(
      alignment_of(bias, bias, bias, bias) > p.align ? at + p.align : at);
  cublasLtMatmulDescOpaque_t desc{};
  ok(describe(desc, dt, aligned_bias), "the matmul description");
  cublasLtMatmulPreferenceOpaque_t pref{};
  ok(cublasLtMatmulPreferenceInit(&pref), "cublasLtMatmulPreferenceInit");
  const uint64_t workspace = kWorkspaceBytes;
  ok(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                          &workspace, sizeof(workspace)),
     "cublasLtMatmulPreferenceSetAttribute (workspace)");
  for (const cublasLtMatmulPreferenceAttributes_t a :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    ok(cublasLtMatmulPreferenceSetAttribute(&pref, a, &p.align, sizeof(p.align)),
       "cublasLtMatmulPreferenceSetAttribute (alignment)");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(lt, &desc, &p.w, &p.x, &p.y, &p.y, &pref, 1, &result, &found);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE)
    return cat("the heuristic said ", cublasGetStatusName(st));
  ok(st, "cublasLtMatmulAlgoGetHeuristic");
  if (found < 1) return "the heuristic proposed no algorithm";
  if (result.state != CUBLAS_STATUS_SUCCESS)
    return cat("the heuristic's algorithm has state ", cublasGetStatusName(result.state));
  if (result.workspaceSize > kWorkspaceBytes)
    return cat("the heuristic's algorithm needs ", result.workspaceSize, " bytes of workspace");
  p.algo = result.algo;
  return {};
}

// The plan of this linear at this alignment (exactly: a plan chosen for less alignment could run
// another algorithm than eager's, with other bits), made on its first call. A static step keeps
// its shape's plans in `slot`. During a capture a missing plan defers the capture
// (cuda::NotReadyForCapture): the phase's stream replay makes it.
const LtPlan& plan_for(Op op, cublasLtHandle_t lt, const GemmShape& g, DType dt, uint32_t align,
                       const void* bias, std::atomic<void*>* slot) {
  const int i = std::countr_zero(align);
  LtShape* shape =
      slot != nullptr ? static_cast<LtShape*>(slot->load(std::memory_order_acquire)) : nullptr;
  if (shape == nullptr) {  // an eager call, or a step's first
    const LtKey key{encore::cuda::current_device(), static_cast<int64_t>(dt), g.m, g.n, g.k};
    shape = &shapes().find_or_make(key, [] { return std::make_unique<LtShape>(); });
    if (slot != nullptr) slot->store(shape, std::memory_order_release);
  }
  if (const LtPlan* p = shape->ready[i].load(std::memory_order_acquire); p != nullptr) [[likely]]
    return *p;
  const std::lock_guard<std::mutex> lock(shape->mu);
  if (const LtPlan* p = shape->ready[i].load(std::memory_order_relaxed); p != nullptr) return *p;
  if (encore::cuda::capturing())
    throw encore::cuda::NotReadyForCapture(
        cat(op_name(op), ": no cuBLASLt algorithm chosen yet for ", operands(g, dt, align),
            " (chosen outside a capture)"));
  auto made = std::make_unique<LtPlan>();
  made->align = align;
  const std::string why_not = choose(op, lt, g, dt, bias, *made);
  made->usable = why_not.empty();
  {
    const std::lock_guard<std::mutex> counts(g_counts_mu);
    if (made->usable) {
      ++g_counts.usable;
    } else {
      ++g_counts.unsupported;
      g_counts.last_unsupported = cat(operands(g, dt, align), ": ", why_not);
    }
  }
  const LtPlan* p = made.get();
  shape->owned[i] = std::move(made);
  shape->ready[i].store(p, std::memory_order_release);
  return *p;
}

}  // namespace

LtPlanCounts lt_plan_counts() {
  const std::lock_guard<std::mutex> lock(g_counts_mu);
  return g_counts;
}

bool linear_bias_lt(Op op, const GemmShape& g, DType dt, const void* x, const void* w,
                    const void* bias, void* y, std::atomic<void*>* slot) {
  static const bool enabled = env::flag("ENCORE_CUDA_LT", true);
  if (!enabled) return false;
  StreamLibraries& libs = cublas_libraries(op);
  const uint32_t align = alignment_of(x, w, bias, y);
  const LtPlan& plan = plan_for(op, libs.lt, g, dt, align, bias, slot);
  if (!plan.usable) return false;
  LtPlan p = plan;  // on the stack: cuBLASLt takes the layouts by non-const pointer
  cublasLtMatmulDescOpaque_t desc{};
  if (const cublasStatus_t st = describe(desc, dt, bias); st != CUBLAS_STATUS_SUCCESS)
    fail_lt(op, "the matmul description", st, g, dt, align);
  const double one64 = 1, zero64 = 0;
  const float one32 = 1, zero32 = 0;
  const bool f64 = dt == DType::Float64;
  const void* one = f64 ? static_cast<const void*>(&one64) : &one32;
  const void* zero = f64 ? static_cast<const void*>(&zero64) : &zero32;
  if (const cublasStatus_t st =
          cublasLtMatmul(libs.lt, &desc, one, w, &p.w, x, &p.x, zero, y, &p.y, y, &p.y, &p.algo,
                         libs.blas_workspace, kWorkspaceBytes, stream());
      st != CUBLAS_STATUS_SUCCESS)
    fail_lt(op, "cublasLtMatmul", st, g, dt, align);
  return true;
}

}  // namespace encore::kernels::cuda
