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

// A double as an exact literal (hexadecimal, or its bits where it is not finite), for attributes
// the unfused kernels take as double.
std::string double_literal(double v) {
  if (std::isfinite(v)) return absl::StrFormat("%a", v);
  return absl::StrFormat("__longlong_as_double(0x%016xLL)", std::bit_cast<uint64_t>(v));
}

// A scalar as a T expression with the value static_cast<T>(v) has on the host: a double
// literal converted to T (hexadecimal, so exact), or its bits where it is not finite.
std::string scalar_literal(double v) {
  return cat("T(", double_literal(v), ")");
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

// The registers an instruction reads: an element function's operands; a row op's (layer_norm's
// gamma and beta where its flags say it has them).
std::vector<uint8_t> reads_of(const FusedInstr& ins) {
  switch (ins.op) {
    case Op::Softmax:
    case Op::LogSoftmax:
    case Op::Sum:
    case Op::Mean:
    case Op::Max:
      return {ins.a};
    case Op::SoftmaxGrad:
    case Op::LogSoftmaxGrad:
      return {ins.a, ins.b};
    case Op::LayerNorm: {
      std::vector<uint8_t> r{ins.a};
      if (ins.flags & kLayerNormGamma) r.push_back(ins.b);
      if (ins.flags & kLayerNormBeta) r.push_back(ins.c);
      return r;
    }
    default: {
      const uint8_t all[] = {ins.a, ins.b, ins.c};
      return std::vector<uint8_t>(all, all + reads_of(element_fn(ins.op).form));
    }
  }
}

// The outputs an instruction writes: layer_norm's y, mean and rstd; one for the rest.
int outputs_of(Op op) {
  return op == Op::LayerNorm ? 3 : 1;
}

// Whether output o of op is one value per row (a reduction's, layer_norm's mean and rstd).
bool column_output(Op op, int o) {
  return row_reduction(op) || (op == Op::LayerNorm && o > 0);
}

}  // namespace

std::string fused_unsupported(const FusedProgram& p) {
  if (p.dtype != DType::Float32 && p.dtype != DType::Float64)
    return cat("a fused program over ", name(p.dtype));
  if (p.row < 1) return "a fused program with rows of no element";
  if (p.row_ops && p.row > kMaxCudaRow)
    return cat("a fused program with row operations over rows of ", p.row,
               " elements (a CUDA fused kernel takes up to ", kMaxCudaRow, ")");
  auto described = [&p](size_t n) { return n == 0 || n == static_cast<size_t>(p.n_in); };
  if (static_cast<int>(p.in_layout.size()) != p.n_in ||
      static_cast<int>(p.out_instr.size()) != p.n_out || !described(p.in_tile.size()) ||
      !described(p.in_bool.size()))
    return "a fused program whose inputs or outputs are not all described";
  for (int k = 0; k < p.n_in; ++k)
    if ((p.in_layout[k] == FusedLayout::Tile) != (p.tile(k) > 0))
      return cat("a fused program whose input ", k, " is a tile without a length, or not a tile");
  std::vector<bool> written(FusedProgram::kMaxRegisters, false);
  // Per register: one value per row (a One or Column input, layer_norm's mean or rstd).
  std::vector<bool> per_row(FusedProgram::kMaxRegisters, false);
  for (int k = 0; k < p.n_in; ++k) {
    written[k] = true;
    per_row[k] = p.in_layout[k] == FusedLayout::One || p.in_layout[k] == FusedLayout::Column;
  }
  for (const FusedInstr& ins : p.instrs) {
    const bool row_op = op_row_fusable(ins.op);
    if (row_op && !p.row_ops) return cat(op_name(ins.op), " in a program without row operations");
    if (row_op && !fused_row_op(DeviceType::CUDA, ins.op, p.row))
      return cat("no CUDA row function for ", op_name(ins.op), " over rows of ", p.row);
    const ElementFn f = element_fn(ins.op);
    if (!row_op && f.name == nullptr) return cat("no CUDA element function for ", op_name(ins.op));
    if (ins.n_out != outputs_of(ins.op))
      return cat(op_name(ins.op), " with ", int{ins.n_out}, " outputs");
    const std::vector<uint8_t> reads = reads_of(ins);
    // A row op works over a value per element; layer_norm reads gamma and beta as inputs of one
    // row (the unfused kernel's [C]).
    const size_t per_element = ins.op == Op::LayerNorm ? 1 : row_op ? reads.size() : 0;
    for (size_t r = 0; r < reads.size(); ++r) {
      if (!written[reads[r]])
        return cat(op_name(ins.op), " reads a register no instruction wrote before it");
      // A bool input is where's condition, and where's condition a bool input.
      const bool condition = ins.op == Op::Where && r == 0;
      if (condition != (reads[r] < p.n_in && p.reads_bool(reads[r])))
        return cat(op_name(ins.op), condition ? " reads a condition that is not a bool input"
                                              : " reads a bool input as a value");
      if (r < per_element && per_row[reads[r]])
        return cat(op_name(ins.op), " over one value per row");
      if (row_op && r >= per_element &&
          (reads[r] >= p.n_in || p.in_layout[reads[r]] != FusedLayout::Row))
        return cat(op_name(ins.op), " reads its gamma or beta other than as an input of one row");
    }
    for (int o = 0; o < ins.n_out; ++o) {
      written[ins.out[o]] = true;
      per_row[ins.out[o]] = column_output(ins.op, o);
    }
  }
  for (int k = 0; k < p.n_out; ++k) {
    const FusedOutputOf& of = p.out_instr[k];
    if (of.instr < 0 || of.instr >= static_cast<int>(p.instrs.size()) || of.output < 0 ||
        of.output >= p.instrs[of.instr].n_out ||
        (!p.out_column.empty() &&
         p.out_column[k] != column_output(p.instrs[of.instr].op, of.output)))
      return "a fused program whose outputs are not its instructions' outputs as they write them";
  }
  return {};
}

std::string fused_prelude() {
  return cat("#include \"", kElementOpsInclude, "\"\nusing namespace encore::kernels::cuda;\n");
}

namespace {

// An elementwise instruction's value: its element function (element_ops.cuh) over the operands'
// values `x` (a, b, c as the form reads them) and its scalar.
std::string element_call(const FusedInstr& ins, const std::string (&x)[3]) {
  // An exponent of exactly 2 is a square, as the unfused kernel decides (element_ops.cuh).
  const ElementFn f = ins.op == Op::PowScalar && ins.scalar == 2.0
                          ? ElementFn{"square", Form::Unary}
                          : element_fn(ins.op);
  std::string args = x[0];
  for (int r = 1; r < reads_of(f.form); ++r) args += cat(", ", x[r]);
  if (f.form == Form::Scalar || f.form == Form::Grad) args += cat(", ", scalar_literal(ins.scalar));
  return cat("el::", f.name, "(", args, ")");
}

// The kernel's head: its name and parameters (the count n, the inputs, the outputs), and the
// element type T and index type I (32-bit where every index of the run fits).
std::string kernel_head(const FusedProgram& p, std::string_view name, std::string_view what) {
  const char* t = p.dtype == DType::Float32 ? "float" : "double";
  std::string s =
      cat("// ", p.instrs.size(), " fused ", what, "\nextern \"C\" __global__ ",
          "void __launch_bounds__(", kFusedThreads, ") ", name, "(unsigned long long n");
  for (int k = 0; k < p.n_in; ++k)
    s += cat(", const ", p.reads_bool(k) ? "unsigned char" : t, "* in", k);
  for (int k = 0; k < p.n_out; ++k) s += cat(", ", t, "* out", k);
  return s + cat(") {\n  typedef ", t, " T;\n  typedef ",
                 p.numel <= int64_t{UINT32_MAX} ? "unsigned int" : "unsigned long long", " I;\n");
}

// A program with row ops: a warp per row (n rows), as the unfused softmax and layer_norm kernels
// run rows of up to kMaxCudaRow elements. Lane g holds its row's elements g, g + 32, ... (K of
// them) of every value the run computes in registers (inputs are read where they are used), and
// folds them in that order before the warp's tree (element_ops.cuh), as those kernels do: the
// unfused steps' bits. A value of one per row (an input [rows, 1], layer_norm's mean and rstd) is
// a scalar every lane holds.
std::string row_kernel_source(const FusedProgram& p, std::string_view name) {
  const int64_t per_lane = (p.row + 31) / 32;
  std::string s = kernel_head(p, name, cat("steps over rows of ", p.row, ", a warp per row"));
  s += cat(
      "  constexpr int K = ", per_lane, ";\n  const I g = threadIdx.x % 32u;\n",
      "  const unsigned long long stride = (unsigned long long)gridDim.x * ", kFusedRowsPerBlock,
      "ull;\n  for (unsigned long long r = (unsigned long long)blockIdx.x * ", kFusedRowsPerBlock,
      "ull + threadIdx.x / 32u; ", "r < n; r += stride) {\n    const I j = (I)r;\n");
  // A loop over the lane's elements e of the row: c its column, i its index in the run.
  auto each = [&](const std::string& body) {
    return cat(
        "    #pragma unroll\n    for (int e = 0; e < K; ++e) {\n      const I c = g + 32u * "
        "(I)e;\n",
        "      if (c < (I)", p.row, "u) {\n        const I i = j * (I)", p.row, "u + c;\n",
        "        (void)i;\n", body, "      }\n    }\n");
  };
  // Each register's value at the lane's element e: an element of an array of K, one value for the
  // row (a scalar), or an input's element read where it is used (registers hold only what the
  // run computes; every input of a row is read before its outputs are written, so in place holds).
  std::vector<std::string> value(FusedProgram::kMaxRegisters);
  for (int k = 0; k < p.n_in; ++k) {
    const FusedLayout l = p.in_layout[k];
    if (l == FusedLayout::One || l == FusedLayout::Column) {
      value[k] = cat("x", k);
      s += cat("    const ", p.reads_bool(k) ? "unsigned char" : "T", " x", k, " = in", k, "[",
               index_of(p, k), "];\n");
    } else {
      value[k] = cat("in", k, "[", index_of(p, k), "]");
    }
  }
  for (size_t v = 0; v < p.instrs.size(); ++v) {
    const FusedInstr& ins = p.instrs[v];
    const std::string a = value[ins.a], b = value[ins.b], c = value[ins.c];
    const std::string out = cat("v", v, "_0");
    s += cat("    // ", op_name(ins.op), "\n");
    switch (ins.op) {
      case Op::Softmax:
      case Op::LogSoftmax: {
        s += cat("    T ", out, "[K];\n    T m", v, " = LaneMaxOp::identity<T>();\n");
        s += each(cat("        m", v, " = LaneMaxOp::combine(m", v, ", ", a, ");\n"));
        s += cat("    m", v, " = warp_reduce<LaneMaxOp>(m", v, ");\n    T sum", v, " = T(0);\n");
        s += each(cat("        sum", v, " += rowop::softmax_term(", a, ", m", v, ");\n"));
        s += cat("    sum", v, " = warp_reduce<SumOp>(sum", v, ");\n");
        if (ins.op == Op::Softmax) {
          s += cat("    const T inv", v, " = T(1) / sum", v, ";\n");
          s += each(
              cat("        ", out, "[e] = rowop::softmax_value(", a, ", m", v, ", inv", v, ");\n"));
        } else {
          s += cat("    const T log_sum", v, " = dev_log(sum", v, ");\n");
          s += each(cat("        ", out, "[e] = rowop::log_softmax_value(", a, ", m", v,
                        ", log_sum", v, ");\n"));
        }
        break;
      }
      case Op::Sum:
      case Op::Mean:
      case Op::Max: {  // reduce.cuh's reduce_rows at a warp per row; one value per row
        const char* fold = ins.op == Op::Max ? "LaneMaxOp" : "SumOp";
        s += cat("    T ", out, " = ", fold, "::identity<T>();\n");
        s += each(cat("        ", out, " = ", fold, "::combine(", out, ", ", a, ");\n"));
        s += cat("    ", out, " = warp_reduce<", fold, ">(", out, ");\n");
        if (ins.op == Op::Mean) s += cat("    ", out, " = ", out, " / (T)", p.row, ";\n");
        value[ins.out[0]] = out;
        continue;
      }
      case Op::SoftmaxGrad:
      case Op::LogSoftmaxGrad: {
        const char* log = ins.op == Op::LogSoftmaxGrad ? "true" : "false";
        s += cat("    T ", out, "[K];\n    T dot", v, " = T(0);\n");
        s += each(
            cat("        dot", v, " += rowop::softmax_grad_term<", log, ">(", a, ", ", b, ");\n"));
        s += cat("    dot", v, " = warp_reduce<SumOp>(dot", v, ");\n");
        s += each(cat("        ", out, "[e] = rowop::softmax_grad_value<", log, ">(", a, ", ", b,
                      ", dot", v, ");\n"));
        break;
      }
      case Op::LayerNorm: {
        const bool gamma = ins.flags & kLayerNormGamma, beta = ins.flags & kLayerNormBeta;
        const std::string count = cat("(double)", p.row);
        s += cat("    T ", out, "[K];\n    double s", v, " = 0;\n");
        s += each(cat("        s", v, " += (double)", a, ";\n"));
        s += cat("    const double mean", v, " = warp_reduce<SumOp>(s", v, ") / ", count,
                 ";\n    double q", v, " = 0;\n");
        s += each(cat("        q", v, " += rowop::layer_norm_square(", a, ", mean", v, ");\n"));
        s += cat("    const double var", v, " = warp_reduce<SumOp>(q", v, ") / ", count, ";\n");
        s += cat("    const T v", v, "_1 = (T)mean", v, ";\n    const T v", v,
                 "_2 = (T)rowop::layer_norm_rstd(var", v, ", ", double_literal(ins.scalar), ");\n");
        s += each(cat("        ", out, "[e] = rowop::layer_norm_value(", a, ", v", v, "_1, v", v,
                      "_2, ", gamma ? "true" : "false", ", ", gamma ? b : "T(1)", ", ",
                      beta ? c : "T(0)", ");\n"));
        value[ins.out[1]] = cat("v", v, "_1");
        value[ins.out[2]] = cat("v", v, "_2");
        break;
      }
      default: {
        const std::string x[3] = {a, b, c};
        s += cat("    T ", out, "[K];\n");
        s += each(cat("        ", out, "[e] = ", element_call(ins, x), ";\n"));
      }
    }
    value[ins.out[0]] = out + "[e]";
  }
  // The outputs, once every input of the row is read: a value per element, or lane 0's per row.
  std::string stores;
  for (int k = 0; k < p.n_out; ++k) {
    const FusedOutputOf& of = p.out_instr[k];
    if (column_output(p.instrs[of.instr].op, of.output)) {
      s += cat("    if (g == 0) out", k, "[j] = v", of.instr, "_", of.output, ";\n");
    } else {
      stores += cat("        out", k, "[i] = v", of.instr, "_", of.output, "[e];\n");
    }
  }
  if (!stores.empty()) s += each(stores);
  return s + "  }\n}\n";
}

}  // namespace

std::string fused_kernel_source(const FusedProgram& p, std::string_view name) {
  if (const std::string why = fused_unsupported(p); !why.empty())
    fail("fused_elementwise: cannot generate CUDA source for ", why);
  if (p.row_ops) return row_kernel_source(p, name);
  // Nothing of the element count but whether indices fit 32 bits: one kernel serves every size.
  std::string s = kernel_head(p, name, "elementwise steps");
  s += cat("  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;\n",
           "  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + ",
           "threadIdx.x; i < n; i += stride) {\n");
  bool rows = false;  // an input reads by row or by column
  for (FusedLayout l : p.in_layout) rows |= l == FusedLayout::Row || l == FusedLayout::Column;
  if (rows)
    s += cat("    const I j = (I)i / (I)", p.row, "ull;\n    const I c = (I)i - j * (I)", p.row,
             "ull;\n");
  // The value each register holds: an input read at the top, then each instruction's result.
  // Every input is read before any output is written, at the thread's own element where it is
  // Full, and the pointers are not __restrict__: a plan may give an output over a Full input
  // (Plan::fold_copies).
  std::vector<std::string> value(FusedProgram::kMaxRegisters);
  for (int k = 0; k < p.n_in; ++k) {
    value[k] = cat("x", k);
    s += cat("    const ", p.reads_bool(k) ? "unsigned char" : "T", " x", k, " = in", k, "[",
             index_of(p, k), "];\n");
  }
  for (size_t v = 0; v < p.instrs.size(); ++v) {
    const FusedInstr& ins = p.instrs[v];
    const std::string x[3] = {value[ins.a], value[ins.b], value[ins.c]};
    s += cat("    const T v", v, " = ", element_call(ins, x), ";  // ", op_name(ins.op), "\n");
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
