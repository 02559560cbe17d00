// Generates the CUDA source of a fused program (fused_source.h).
#include "kernels/cuda/fused_source.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/strings/str_format.h"
#include "runtime/error.h"

namespace encore::kernels::cuda {
namespace {

// How an op's element function (element_ops.cuh) takes its operands.
enum class Form {
  Binary,  // f(a, b)
  Scalar,  // f(a, s): s its ScalarAttrs value (a slope or a form for activations)
  Unary,   // f(a)
  Grad,    // f(a, gy, s)
  Where,   // f(c, a, b): c the condition, a bool input
};

struct ElementFn {
  const char* name = nullptr;  // null: no element function
  Form form = Form::Unary;
};

// Here goes a new fusable op's element function.
ElementFn element_fn(Op op) {
  switch (op) {
    case Op::Add:
      return {"add", Form::Binary};
    case Op::Sub:
      return {"sub", Form::Binary};
    case Op::Mul:
      return {"mul", Form::Binary};
    case Op::Div:
      return {"div", Form::Binary};
    case Op::AddScalar:
      return {"add_scalar", Form::Scalar};
    case Op::MulScalar:
      return {"mul_scalar", Form::Scalar};
    case Op::RsubScalar:
      return {"rsub_scalar", Form::Scalar};
    case Op::DivScalar:
      return {"div_scalar", Form::Scalar};
    case Op::RdivScalar:
      return {"rdiv_scalar", Form::Scalar};
    case Op::PowScalar:
      return {"pow_scalar", Form::Scalar};
    case Op::LeakyRelu:
      return {"leaky_relu", Form::Scalar};
    case Op::Gelu:
      return {"gelu", Form::Scalar};
    case Op::Neg:
      return {"neg", Form::Unary};
    case Op::Exp:
      return {"exp", Form::Unary};
    case Op::Log:
      return {"log", Form::Unary};
    case Op::Sqrt:
      return {"sqrt", Form::Unary};
    case Op::Relu:
      return {"relu", Form::Unary};
    case Op::Sigmoid:
      return {"sigmoid", Form::Unary};
    case Op::Tanh:
      return {"tanh", Form::Unary};
    case Op::ReluGrad:
      return {"relu_grad", Form::Grad};
    case Op::LeakyReluGrad:
      return {"leaky_relu_grad", Form::Grad};
    case Op::SigmoidGrad:
      return {"sigmoid_grad", Form::Grad};
    case Op::TanhGrad:
      return {"tanh_grad", Form::Grad};
    case Op::GeluGrad:
      return {"gelu_grad", Form::Grad};
    case Op::Where:
      return {"where", Form::Where};
    default:
      return {};
  }
}

// A scalar as a T expression with the value static_cast<T>(v) has on the host: a double
// literal converted to T (hexadecimal, so exact), or its bits where it is not finite.
std::string scalar_literal(double v) {
  if (std::isfinite(v)) return absl::StrFormat("T(%a)", v);
  return absl::StrFormat("T(__longlong_as_double(0x%016xLL))", std::bit_cast<uint64_t>(v));
}

// The element input k reads at the run's element i (j its row, c its column).
std::string index_of(const FusedProgram& p, int k) {
  switch (p.in_layout[k]) {
    case FusedLayout::Full:
      return "i";
    case FusedLayout::One:
      return "0";
    case FusedLayout::Row:
      return "c";
    case FusedLayout::Column:
      return "j";
    case FusedLayout::Tile:
      return cat("(I)i % (I)", p.tile(k), "ull");
  }
  return "i";
}

// How many registers an instruction of form f reads: a, then b, then c.
int reads_of(Form f) {
  switch (f) {
    case Form::Binary:
    case Form::Grad:
      return 2;
    case Form::Where:
      return 3;
    default:
      return 1;
  }
}

}  // namespace

std::string fused_unsupported(const FusedProgram& p) {
  if (p.dtype != DType::Float32 && p.dtype != DType::Float64)
    return cat("a fused program over ", name(p.dtype));
  if (p.row_ops) return "a fused program with row operations";
  if (p.row < 1) return "a fused program with rows of no element";
  auto described = [&p](size_t n) { return n == 0 || n == static_cast<size_t>(p.n_in); };
  if (static_cast<int>(p.in_layout.size()) != p.n_in ||
      static_cast<int>(p.out_instr.size()) != p.n_out || !described(p.in_tile.size()) ||
      !described(p.in_bool.size()))
    return "a fused program whose inputs or outputs are not all described";
  for (int k = 0; k < p.n_in; ++k)
    if ((p.in_layout[k] == FusedLayout::Tile) != (p.tile(k) > 0))
      return cat("a fused program whose input ", k, " is a tile without a length, or not a tile");
  std::vector<bool> written(FusedProgram::kMaxRegisters, false);
  for (int k = 0; k < p.n_in; ++k) written[k] = true;
  for (const FusedInstr& ins : p.instrs) {
    const ElementFn f = element_fn(ins.op);
    if (f.name == nullptr) return cat("no CUDA element function for ", op_name(ins.op));
    if (ins.n_out != 1) return cat(op_name(ins.op), " with ", int{ins.n_out}, " outputs");
    const uint8_t reads[] = {ins.a, ins.b, ins.c};
    for (int r = 0; r < reads_of(f.form); ++r) {
      if (!written[reads[r]])
        return cat(op_name(ins.op), " reads a register no instruction wrote before it");
      // A bool input is where's condition, and where's condition a bool input.
      const bool condition = f.form == Form::Where && r == 0;
      if (condition != (reads[r] < p.n_in && p.reads_bool(reads[r])))
        return cat(op_name(ins.op), condition ? " reads a condition that is not a bool input"
                                              : " reads a bool input as a value");
    }
    written[ins.out[0]] = true;
  }
  for (int k = 0; k < p.n_out; ++k) {
    const FusedOutputOf& of = p.out_instr[k];
    if (of.instr < 0 || of.instr >= static_cast<int>(p.instrs.size()) || of.output != 0 ||
        (!p.out_column.empty() && p.out_column[k]))
      return "a fused program whose outputs are not its instructions' only outputs";
  }
  return {};
}

std::string fused_prelude() {
  return cat("#include \"", kElementOpsInclude, "\"\nusing namespace encore::kernels::cuda;\n");
}

std::string fused_kernel_source(const FusedProgram& p, std::string_view name) {
  if (const std::string why = fused_unsupported(p); !why.empty())
    fail("fused_elementwise: cannot generate CUDA source for ", why);
  const char* t = p.dtype == DType::Float32 ? "float" : "double";
  // Row and column indices in 32-bit arithmetic where every index fits.
  const bool narrow = p.numel <= int64_t{UINT32_MAX};
  // Nothing of the element count but whether indices fit 32 bits: one kernel serves every size.
  std::string s = cat("// ", p.instrs.size(), " fused elementwise steps\nextern \"C\" __global__ ",
                      "void __launch_bounds__(256) ", name, "(unsigned long long n");
  for (int k = 0; k < p.n_in; ++k)
    s += cat(", const ", p.reads_bool(k) ? "unsigned char" : t, "* in", k);
  for (int k = 0; k < p.n_out; ++k) s += cat(", ", t, "* out", k);
  s += cat(") {\n  typedef ", t, " T;\n  typedef ", narrow ? "unsigned int" : "unsigned long long",
           " I;\n  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;\n",
           "  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + ",
           "threadIdx.x; i < n; i += stride) {\n");
  bool rows = false;  // an input reads by row or by column
  for (FusedLayout l : p.in_layout) rows |= l == FusedLayout::Row || l == FusedLayout::Column;
  if (rows)
    s += cat("    const I j = (I)i / (I)", p.row, "ull;\n    const I c = (I)i - j * (I)", p.row,
             "ull;\n");
  // The value each register holds: an input read at the top, then each instruction's result.
  std::vector<std::string> value(FusedProgram::kMaxRegisters);
  for (int k = 0; k < p.n_in; ++k) {
    value[k] = cat("x", k);
    s += cat("    const ", p.reads_bool(k) ? "unsigned char" : "T", " x", k, " = in", k, "[",
             index_of(p, k), "];\n");
  }
  for (size_t v = 0; v < p.instrs.size(); ++v) {
    const FusedInstr& ins = p.instrs[v];
    // An exponent of exactly 2 is a square, as the unfused kernel decides (element_ops.cuh).
    const ElementFn f = ins.op == Op::PowScalar && ins.scalar == 2.0
                            ? ElementFn{"square", Form::Unary}
                            : element_fn(ins.op);
    std::string args = value[ins.a];
    if (reads_of(f.form) > 1) args += cat(", ", value[ins.b]);
    if (reads_of(f.form) > 2) args += cat(", ", value[ins.c]);
    if (f.form == Form::Scalar || f.form == Form::Grad)
      args += cat(", ", scalar_literal(ins.scalar));
    s += cat("    const T v", v, " = el::", f.name, "(", args, ");  // ", op_name(ins.op), "\n");
    value[ins.out[0]] = cat("v", v);
  }
  for (int k = 0; k < p.n_out; ++k) s += cat("    out", k, "[i] = v", p.out_instr[k].instr, ";\n");
  s += "  }\n}\n";
  return s;
}

std::string fused_source(const FusedProgram& p) {
  return fused_prelude() + fused_kernel_source(p, kFusedKernelName);
}

}  // namespace encore::kernels::cuda
