// FusedElementwise (runtime/fused.h): a run of elementwise steps of a cpu plan, executed
// block by block. Every instruction runs over one block of up to kBlock elements before the
// next starts, so the block stays in L1 and the intermediates only the run reads live in
// scratch blocks on the stack. Each instruction computes its elements with the element
// function of its op's own kernel (elementwise.h), so the bits equal the unfused steps' (but
// for which NaN an operation on two NaNs returns: see runtime/fused.h).
#include <algorithm>
#include <cstdint>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/kernel.h"
#include "kernels/cpu/simd.h"
#include "runtime/fused.h"

namespace encore::kernels::cpu {
namespace {

constexpr int64_t kBlock = 256;

template <Op kOp, typename T>
void binary(const T* a, bool a_scalar, const T* b, bool b_scalar, T* o, int64_t n) {
  const BinaryOp<kOp> f;
  if (b_scalar) {
    const T bv = *b;
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], bv);
  } else if (a_scalar) {
    const T av = *a;
    for (int64_t i = 0; i < n; ++i) o[i] = f(av, b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], b[i]);
  }
}

template <Op kOp, typename T>
void with_scalar(const T* a, T s, T* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = scalar_op<kOp>(a[i], s);
}

template <Op kOp, typename T>
void unary(const T* a, T* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = unary_op<kOp>(a[i]);
}

template <Op kOp, typename T>
void grad(const T* a, const T* g, T s, T* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = activation_grad<kOp>(a[i], g[i], s);
}

// One instruction over n elements. `reg` holds this block's address of every register.
template <typename T>
void run(const FusedInstr& ins, T* const* reg, uint64_t broadcast, int64_t n) {
  const T* a = reg[ins.a];
  const T* b = reg[ins.b];
  T* o = reg[ins.out];
  const bool a1 = ins.a < 64 && (broadcast >> ins.a & 1);
  const bool b1 = ins.b < 64 && (broadcast >> ins.b & 1);
  const T s = static_cast<T>(ins.scalar);
  switch (ins.op) {
    case Op::Add:
      return binary<Op::Add>(a, a1, b, b1, o, n);
    case Op::Sub:
      return binary<Op::Sub>(a, a1, b, b1, o, n);
    case Op::Mul:
      return binary<Op::Mul>(a, a1, b, b1, o, n);
    case Op::Div:
      return binary<Op::Div>(a, a1, b, b1, o, n);
    case Op::AddScalar:
      return with_scalar<Op::AddScalar>(a, s, o, n);
    case Op::MulScalar:
      return with_scalar<Op::MulScalar>(a, s, o, n);
    case Op::RsubScalar:
      return with_scalar<Op::RsubScalar>(a, s, o, n);
    case Op::DivScalar:
      return with_scalar<Op::DivScalar>(a, s, o, n);
    case Op::RdivScalar:
      return with_scalar<Op::RdivScalar>(a, s, o, n);
    case Op::PowScalar:
      if (ins.scalar == 2) {  // as scalar_kernel: x * x, not pow
        for (int64_t i = 0; i < n; ++i) o[i] = a[i] * a[i];
        return;
      }
      return with_scalar<Op::PowScalar>(a, s, o, n);
    case Op::LeakyRelu:
      return with_scalar<Op::LeakyRelu>(a, s, o, n);
    case Op::Gelu:
      return with_scalar<Op::Gelu>(a, s, o, n);
    case Op::Neg:
      return unary<Op::Neg>(a, o, n);
    case Op::Exp:
      return unary<Op::Exp>(a, o, n);
    case Op::Log:
      return unary<Op::Log>(a, o, n);
    case Op::Sqrt:
      return sqrt_array(a, o, n);
    case Op::Relu:
      return unary<Op::Relu>(a, o, n);
    case Op::Sigmoid:
      return unary<Op::Sigmoid>(a, o, n);
    case Op::Tanh:
      return unary<Op::Tanh>(a, o, n);
    case Op::ReluGrad:
      return grad<Op::ReluGrad>(a, b, s, o, n);
    case Op::LeakyReluGrad:
      return grad<Op::LeakyReluGrad>(a, b, s, o, n);
    case Op::SigmoidGrad:
      return grad<Op::SigmoidGrad>(a, b, s, o, n);
    case Op::TanhGrad:
      return grad<Op::TanhGrad>(a, b, s, o, n);
    case Op::GeluGrad:
      return grad<Op::GeluGrad>(a, b, s, o, n);
    default:
      throw Error(cat("fused_elementwise: ", op_name(ins.op), " cannot be fused"));
  }
}

void fused_kernel(const KernelArgs& args) {
  const FusedProgram& p = *args.attr<FusedAttrs>().program;
  switch_floating(p.dtype, Op::FusedElementwise, [&]<typename T>(Type<T>) {
    // Written before read: every scratch register is an instruction's output first.
    alignas(64) T scratch[FusedProgram::kMaxScratch][kBlock];
    T* reg[FusedProgram::kMaxRegisters];
    for (int s = 0; s < p.n_scratch; ++s) reg[p.scratch_reg(s)] = scratch[s];
    for (int64_t i0 = 0; i0 < p.numel; i0 += kBlock) {
      const int64_t n = std::min(kBlock, p.numel - i0);
      for (int r = 0; r < p.n_in; ++r)
        reg[r] = const_cast<T*>(args.in[r].as<T>()) + ((p.broadcast >> r & 1) ? 0 : i0);
      for (int r = 0; r < p.n_out; ++r) reg[p.out_reg(r)] = args.out[r].as<T>() + i0;
      for (const FusedInstr& ins : p.instrs) run(ins, reg, p.broadcast, n);
    }
  });
}

[[maybe_unused]] const bool kRegistered = [] {
  register_kernel(Op::FusedElementwise, DeviceType::CPU, &fused_kernel);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cpu
