// FusedElementwise (runtime/fused.h): a run of elementwise steps of a cpu plan, executed
// block by block. Every instruction runs over one block of up to kBlock elements before the
// next starts, so the block stays in L1 and the intermediates only the run reads live in
// scratch blocks on the stack. Each instruction computes its elements with the element
// function of its op's own kernel (elementwise.h), so the bits equal the unfused steps' (but
// for which NaN an operation on two NaNs returns: see runtime/fused.h). A program that reads
// operands broadcast along or across rows, or has row ops (fused_rows.h), runs blocks of whole
// rows (or pieces of one long row), so a broadcast operand is a pointer or a scalar per row.
#include <algorithm>
#include <cstdint>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fused_rows.h"
#include "kernels/cpu/kernel.h"
#include "kernels/cpu/simd.h"
#include "runtime/fused.h"

namespace encore::kernels::cpu {
namespace {

// A block: n elements from the run's element i0, whose first is at column c0 of its row (of
// `row` elements).
struct Block {
  int64_t i0, n, c0, row;
};

// An operand of an instruction: its register's address for the block, its layout and, for a
// Tile, the tile's element count.
template <typename T>
struct Read {
  const T* x;
  FusedLayout l;
  int64_t tile;
  // One value for a whole piece of a row: a single element, or a row's value.
  bool scalar() const { return l == FusedLayout::One || l == FusedLayout::Column; }
  // The address of the block's element p (and those after it in p's row).
  const T* at(const Block& k, int64_t p) const {
    switch (l) {
      case FusedLayout::Full:
        return x + p;
      case FusedLayout::Row:
        return x + (k.c0 + p) % k.row;
      case FusedLayout::Column:
        return x + (k.c0 + p) / k.row;
      case FusedLayout::Tile:
        return x + (k.i0 + p) % tile;
      case FusedLayout::One:
        break;
    }
    return x;
  }
};

// The elements of the block from p to the end of p's row (or of the block).
inline int64_t piece(const Block& k, int64_t p) {
  return std::min(k.n - p, k.row - (k.c0 + p) % k.row);
}

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

// a op b over a block whose operands may be broadcast along (Row) or across (Column) rows, or
// tiled over the leading axes: per piece of a row, each operand is a pointer or a scalar.
template <Op kOp, typename T>
void binary_by_rows(const Read<T>& a, const Read<T>& b, T* o, const Block& k) {
  for (int64_t p = 0; p < k.n;) {
    const int64_t m = piece(k, p);
    const T* pa = a.at(k, p);
    const T* pb = b.at(k, p);
    if (a.scalar() && b.scalar()) {
      const T v = BinaryOp<kOp>{}(*pa, *pb);
      std::fill(o + p, o + p + m, v);
    } else {
      binary<kOp>(pa, a.scalar(), pb, b.scalar(), o + p, m);
    }
    p += m;
  }
}

template <Op kOp, typename T>
void binary_op(const Read<T>& a, const Read<T>& b, T* o, const Block& k) {
  auto simple = [](FusedLayout l) { return l == FusedLayout::Full || l == FusedLayout::One; };
  if (simple(a.l) && simple(b.l))
    return binary<kOp>(a.x, a.l == FusedLayout::One, b.x, b.l == FusedLayout::One, o, k.n);
  binary_by_rows<kOp>(a, b, o, k);
}

// o[i] = where(c[i], a[i], b[i]) over m elements, a (kA) or b (kB) one value for all of them.
template <bool kA, bool kB, typename T>
void select(const bool* c, const T* a, const T* b, T* o, int64_t m) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(c);
  for (int64_t i = 0; i < m; ++i) o[i] = where_of(bytes[i], a[kA ? 0 : i], b[kB ? 0 : i]);
}

// o = c ? a : b, as where's kernel (binary.cc), each operand in its layout: per piece of a row,
// a pointer or one value.
template <typename T>
void where_op(const Read<bool>& c, const Read<T>& a, const Read<T>& b, T* o, const Block& k) {
  for (int64_t p = 0; p < k.n;) {
    const int64_t m = piece(k, p);
    const bool* pc = c.at(k, p);
    const T* pa = a.at(k, p);
    const T* pb = b.at(k, p);
    if (c.scalar()) {  // one condition for the piece: a copy of one side (or it is the output)
      const bool yes = *reinterpret_cast<const uint8_t*>(pc) != 0;
      const T* from = yes ? pa : pb;
      if ((yes ? a : b).scalar()) {
        std::fill(o + p, o + p + m, *from);
      } else if (from != o + p) {
        std::copy(from, from + m, o + p);
      }
    } else if (a.scalar()) {
      b.scalar() ? select<true, true>(pc, pa, pb, o + p, m)
                 : select<true, false>(pc, pa, pb, o + p, m);
    } else {
      b.scalar() ? select<false, true>(pc, pa, pb, o + p, m)
                 : select<false, false>(pc, pa, pb, o + p, m);
    }
    p += m;
  }
}

// One elementwise instruction over a block. `reg` holds this block's address of every register
// (a bool input's: its bytes).
template <typename T>
void run(const FusedProgram& prog, const FusedInstr& ins, T* const* reg, const Block& k) {
  auto read = [&](uint8_t r, FusedLayout l) {
    return Read<T>{reg[r], l, r < prog.n_in ? prog.tile(r) : 0};
  };
  const T* a = reg[ins.a];
  const T* b = reg[ins.b];
  T* o = reg[ins.out[0]];
  const int64_t n = k.n;
  const T s = static_cast<T>(ins.scalar);
  switch (ins.op) {
    case Op::Add:
      return binary_op<Op::Add>(read(ins.a, ins.la), read(ins.b, ins.lb), o, k);
    case Op::Sub:
      return binary_op<Op::Sub>(read(ins.a, ins.la), read(ins.b, ins.lb), o, k);
    case Op::Mul:
      return binary_op<Op::Mul>(read(ins.a, ins.la), read(ins.b, ins.lb), o, k);
    case Op::Div:
      return binary_op<Op::Div>(read(ins.a, ins.la), read(ins.b, ins.lb), o, k);
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
      return with_gelu_form(s, [&](auto tanh) {
        for (int64_t i = 0; i < n; ++i) o[i] = gelu_of<decltype(tanh)::value>(a[i]);
      });
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
      return with_gelu_form(s, [&](auto tanh) {
        for (int64_t i = 0; i < n; ++i) o[i] = gelu_grad_of<decltype(tanh)::value>(a[i], b[i]);
      });
    case Op::Where: {
      const Read<bool> c{reinterpret_cast<const bool*>(reg[ins.a]), ins.la, prog.tile(ins.a)};
      return where_op(c, read(ins.b, ins.lb), read(ins.c, ins.lc), o, k);
    }
    default:
      throw Error(cat("fused_elementwise: ", op_name(ins.op), " cannot be fused"));
  }
}

// Registers point at the block's part of each operand: a Full one at its element i0, a Column
// one at the value of the block's first row, One, Row and Tile ones at their start. A bool input
// (where's condition) is its bytes, cast to T* there and back by where. A block runs every
// instruction before the next block starts, and an elementwise instruction reads each element
// of a Full input before it writes that element of its output: so a plan may give a program
// without row ops whose last instruction writes its output that output over a Full input
// (Plan::fold_copies).
template <typename T, int64_t kCapacity>
void run_program(const FusedProgram& p, const KernelArgs& args) {
  // Written before read: every scratch register is an instruction's output first.
  alignas(64) T scratch[FusedProgram::kMaxScratch][kCapacity];
  T* reg[FusedProgram::kMaxRegisters];
  for (int s = 0; s < p.n_scratch; ++s) reg[p.scratch_reg(s)] = scratch[s];
  const int64_t row = p.by_rows ? p.row : p.numel;
  // Elements per block: whole rows when a row fits, else pieces of one row.
  const int64_t span = !p.by_rows || row > kCapacity ? kCapacity : kCapacity / row * row;
  const bool whole = p.numel == row;
  for (int64_t i0 = 0; i0 < p.numel;) {
    const int64_t c0 = p.by_rows ? i0 % row : 0;
    int64_t n = std::min(span, p.numel - i0);
    if (row > kCapacity) n = std::min(n, row - c0);  // a piece of one long row
    const Block k{i0, n, c0, row};
    const int64_t r0 = i0 / row;
    for (int r = 0; r < p.n_in; ++r) {
      // The element the block starts at: i0, the first row's value, or the start.
      int64_t first = 0;
      if (p.in_layout[r] == FusedLayout::Full) first = i0;
      if (p.in_layout[r] == FusedLayout::Column) first = r0;
      reg[r] = p.reads_bool(r) ? reinterpret_cast<T*>(args.in[r].as<bool>() + first)
                               : args.in[r].as<T>() + first;
    }
    for (int r = 0; r < p.n_out; ++r)
      reg[p.out_reg(r)] = args.out[r].as<T>() + (p.out_column[r] ? r0 : i0);
    for (const FusedInstr& ins : p.instrs) {
      if (op_row_fusable(ins.op)) {
        run_row_op(ins, reg, k.n / row, row, whole);
      } else {
        run(p, ins, reg, k);
      }
    }
    i0 += k.n;
  }
}

void fused_kernel(const KernelArgs& args) {
  const FusedProgram& p = *args.attr<FusedAttrs>().program;
  switch_floating(p.dtype, Op::FusedElementwise, [&]<typename T>(Type<T>) {
    if (p.block() <= FusedProgram::kBlock) return run_program<T, FusedProgram::kBlock>(p, args);
    run_program<T, FusedProgram::kMaxRow>(p, args);
  });
}

[[maybe_unused]] const bool kRegistered = [] {
  register_kernel(Op::FusedElementwise, DeviceType::CPU, &fused_kernel);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cpu
