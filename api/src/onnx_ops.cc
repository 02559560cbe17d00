// The op mapping of the ONNX exporter: the nodes (opset 17) each recorded op becomes.
#include <cmath>
#include <numbers>

#include "api/src/onnx_graph.h"

namespace encore::onnx_export {
namespace {

void attr_int(onnx::NodeProto& n, const char* name, int64_t v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

void attr_ints(onnx::NodeProto& n, const char* name, const std::vector<int64_t>& v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}

void attr_float(onnx::NodeProto& n, const char* name, double v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(static_cast<float>(v));
}

// The batch dimension of `v` seen in a result of rank `rank` that broadcasts it (NumPy rules
// align trailing dimensions).
int aligned_batch(const Value& v, int rank) {
  const int b = v.batch < 0 ? -1 : v.batch + rank - v.shape.rank();
  return b < 0 ? -1 : b;
}

// The batch dimension of a broadcasting op's output of rank `rank`.
int broadcast_batch(std::initializer_list<const Value*> in, int rank) {
  for (const Value* v : in)
    if (int b = aligned_batch(*v, rank); b >= 0) return b;
  return -1;
}

// One input, one output of the same shape: unary ops, in ONNX as in encore.
void unary(GraphBuilder& g, const Step& s, const char* op_type) {
  const Value x = g.read(s.in[0]);
  g.define(s.out[0], g.node1(op_type, {x.name}, op_type), x.batch);
}

void binary(GraphBuilder& g, const Step& s, const char* op_type) {
  const Value a = g.read(s.in[0]), b = g.read(s.in[1]);
  g.define(s.out[0], g.node1(op_type, {a.name, b.name}, op_type),
           broadcast_batch({&a, &b}, s.out[0].shape.rank()));
}

// x (op) s, or s (op) x when `scalar_first`.
void with_scalar(GraphBuilder& g, const Step& s, const char* op_type, bool scalar_first) {
  const Value x = g.read(s.in[0]);
  const std::string c = g.scalar(s.attrs.as<ScalarAttrs>().value, x.dtype);
  g.define(
      s.out[0],
      g.node1(op_type, scalar_first ? std::vector{c, x.name} : std::vector{x.name, c}, op_type),
      x.batch);
}

// GELU, which opset 17 lacks, from its formula: 0.5 x (1 + erf(x / sqrt 2)), or with the tanh
// approximation 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) as encore's kernel computes it.
void gelu(GraphBuilder& g, const Step& s) {
  const Value x = g.read(s.in[0]);
  const DType t = x.dtype;
  std::string inner;
  if (s.attrs.as<ScalarAttrs>().value == kGeluTanh) {
    const std::string cube =
        g.node1("Mul", {x.name, g.node1("Mul", {x.name, x.name}, "gelu_sq")}, "gelu_cube");
    const std::string sum = g.node1(
        "Add", {x.name, g.node1("Mul", {g.scalar(0.044715, t), cube}, "gelu_k")}, "gelu_sum");
    inner = g.node1(
        "Tanh", {g.node1("Mul", {g.scalar(std::sqrt(2 / std::numbers::pi), t), sum}, "gelu_in")},
        "gelu_tanh");
  } else {
    inner =
        g.node1("Erf", {g.node1("Mul", {x.name, g.scalar(std::numbers::sqrt2 / 2, t)}, "gelu_in")},
                "gelu_erf");
  }
  const std::string half_x = g.node1("Mul", {g.scalar(0.5, t), x.name}, "gelu_half");
  g.define(s.out[0],
           g.node1("Mul", {half_x, g.node1("Add", {g.scalar(1, t), inner}, "gelu_one")}, "gelu"),
           x.batch);
}

// Transposes the last two dimensions of `v`.
std::string transposed(GraphBuilder& g, const Value& v) {
  std::vector<int64_t> perm;
  for (int d = 0; d < v.shape.rank(); ++d) perm.push_back(d);
  std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
  std::string out = g.fresh(v.name + "_t");
  attr_ints(g.node("Transpose", {v.name}, {out}), "perm", perm);
  return out;
}

void matmul(GraphBuilder& g, const Step& s) {
  const Value a = g.read(s.in[0]), b = g.read(s.in[1]);
  const MatmulAttrs& m = s.attrs.as<MatmulAttrs>();
  const int rank = s.out[0].shape.rank();
  // The batch may be a leading (batched-product) dimension of either operand, or the rows of an
  // untransposed a: those are where it lands in the result.
  if ((a.batch >= 0 && a.batch >= a.shape.rank() - (m.trans_a ? 2 : 1)) ||
      (b.batch >= 0 && b.batch >= b.shape.rank() - 2))
    g.fail("the batch is a matrix dimension the product sums over or transposes");
  const std::string y = g.node1(
      "MatMul", {m.trans_a ? transposed(g, a) : a.name, m.trans_b ? transposed(g, b) : b.name},
      "matmul");
  g.define(s.out[0], y, broadcast_batch({&a, &b}, rank));
}

// y = x W^T (+ b): Gemm for a matrix, else MatMul by the transposed weight.
void linear(GraphBuilder& g, const Step& s) {
  const Value x = g.read(s.in[0]), w = g.read(s.in[1]);
  if (x.batch == x.shape.rank() - 1) g.fail("the batch is the dimension the product sums over");
  std::vector<std::string> in{x.name, w.name};
  if (s.in.size() > 2) in.push_back(g.read(s.in[2]).name);
  std::string y;
  if (x.shape.rank() == 2) {
    y = g.fresh("linear");
    attr_int(g.node("Gemm", in, {y}), "transB", 1);
  } else {
    y = g.node1("MatMul", {x.name, transposed(g, w)}, "linear");
    if (in.size() > 2) y = g.node1("Add", {y, in[2]}, "linear_bias");
  }
  g.define(s.out[0], y, x.batch);
}

// Sum, Mean, Max over the axes of a mask. ReduceSum takes its axes as an input since opset 13,
// the others as an attribute until opset 18.
void reduce(GraphBuilder& g, const Step& s, const char* op_type) {
  const Value x = g.read(s.in[0]);
  const ReduceAttrs& r = s.attrs.as<ReduceAttrs>();
  std::vector<int64_t> axes;
  int batch = x.batch;
  for (int d = 0; d < x.shape.rank(); ++d)
    if (r.axes_mask & (1u << d)) {
      axes.push_back(d);
      if (d == x.batch)
        batch = -1;
      else if (d < x.batch && !r.keepdims && batch >= 0)
        --batch;
    }
  const std::string y = g.fresh(op_type);
  onnx::NodeProto& n = s.op == Op::Sum ? g.node(op_type, {x.name, g.ints(axes)}, {y})
                                       : g.node(op_type, {x.name}, {y});
  if (s.op != Op::Sum) attr_ints(n, "axes", axes);
  attr_int(n, "keepdims", r.keepdims ? 1 : 0);
  g.define(s.out[0], y, batch);
}

void permute(GraphBuilder& g, const Step& s) {
  const Value x = g.read(s.in[0]);
  const PermuteAttrs& p = s.attrs.as<PermuteAttrs>();
  std::vector<int64_t> perm;
  int batch = -1;
  for (int d = 0; d < x.shape.rank(); ++d) {
    perm.push_back(p.perm[d]);
    if (p.perm[d] == x.batch) batch = d;
  }
  const std::string y = g.fresh("permute");
  attr_ints(g.node("Transpose", {x.name}, {y}), "perm", perm);
  g.define(s.out[0], y, batch);
}

// Expand to the output's shape. When x has no batch (a [1, n] parameter broadcast to
// {x.size(0), n}, a sum over the batch broadcast back), a dimension that the broadcast makes
// equal to the traced batch size is the batch, as fill() takes it, so the file runs at any
// batch size; two such dimensions are an Error.
void broadcast_to(GraphBuilder& g, const Step& s) {
  const Value x = g.read(s.in[0]);
  const Shape& out = s.out[0].shape;
  int batch = aligned_batch(x, out.rank());
  if (batch < 0 && g.batch_size() > 0) {
    const int lead = out.rank() - x.shape.rank();  // dimensions x lacks, before its own
    for (int d = 0; d < out.rank(); ++d) {
      const bool expanded = d < lead || x.shape[d - lead] != out[d];
      if (!expanded || out[d] != g.batch_size()) continue;
      if (batch >= 0)
        g.fail(cat("broadcasts a tensor ", x.shape, " to ", out,
                   " with two new dimensions of the traced batch size ", g.batch_size(),
                   ": which one is the batch is unknown"));
      batch = d;
    }
  }
  g.define(s.out[0], g.node1("Expand", {x.name, g.shape_tensor(out, batch)}, "broadcast_to"),
           batch);
}

void concat(GraphBuilder& g, const Step& s) {
  std::vector<std::string> in;
  int batch = -1;
  for (const Operand& o : s.in) {
    const Value v = g.read(o);
    in.push_back(v.name);
    if (batch < 0) batch = v.batch;
  }
  const std::string y = g.fresh("concat");
  attr_int(g.node("Concat", in, {y}), "axis", s.attrs.as<AxisAttrs>().axis);
  g.define(s.out[0], y, batch);
}

void split(GraphBuilder& g, const Step& s) {
  const Value x = g.read(s.in[0]);
  const int axis = s.attrs.as<AxisAttrs>().axis;
  if (axis == x.batch) g.fail("splits the batch: its parts' sizes hold the traced batch size");
  std::vector<int64_t> sizes;
  std::vector<std::string> out;
  for (const Operand& o : s.out) {
    sizes.push_back(o.shape[axis]);
    out.push_back(g.fresh("split"));
  }
  attr_int(g.node("Split", {x.name, g.ints(sizes)}, out), "axis", axis);
  for (size_t k = 0; k < s.out.size(); ++k) g.define(s.out[k], out[k], x.batch);
}

void slice(GraphBuilder& g, const Step& s) {
  const Value x = g.read(s.in[0]);
  const SliceAttrs& a = s.attrs.as<SliceAttrs>();
  if (a.axis == x.batch) g.fail("slices the batch: its bounds hold the traced batch size");
  g.define(
      s.out[0],
      g.node1("Slice",
              {x.name, g.ints({a.start}), g.ints({a.stop}), g.ints({a.axis}), g.ints({a.step})},
              "slice"),
      x.batch);
}

void axis_op(GraphBuilder& g, const Step& s, const char* op_type) {
  const Value x = g.read(s.in[0]);
  const std::string y = g.fresh(op_type);
  attr_int(g.node(op_type, {x.name}, {y}), "axis", s.attrs.as<AxisAttrs>().axis);
  g.define(s.out[0], y, x.batch);
}

void conv2d(GraphBuilder& g, const Step& s) {
  const Value x = g.read(s.in[0]);
  std::vector<std::string> in{x.name, g.read(s.in[1]).name};
  if (s.in.size() > 2) in.push_back(g.read(s.in[2]).name);
  const Conv2dAttrs& c = s.attrs.as<Conv2dAttrs>();
  const std::string y = g.fresh("conv2d");
  onnx::NodeProto& n = g.node("Conv", in, {y});
  attr_ints(n, "strides", {c.stride[0], c.stride[1]});
  attr_ints(n, "pads", {c.padding[0], c.padding[1], c.padding[0], c.padding[1]});
  attr_ints(n, "dilations", {c.dilation[0], c.dilation[1]});
  attr_int(n, "group", c.groups);
  g.define(s.out[0], y, x.batch);
}

void pool2d(GraphBuilder& g, const Step& s, const char* op_type) {
  const Value x = g.read(s.in[0]);
  const Pool2dAttrs& p = s.attrs.as<Pool2dAttrs>();
  const std::string y = g.fresh(op_type);
  onnx::NodeProto& n = g.node(op_type, {x.name}, {y});
  attr_ints(n, "kernel_shape", {p.kernel[0], p.kernel[1]});
  attr_ints(n, "strides", {p.stride[0], p.stride[1]});
  attr_ints(n, "pads", {p.padding[0], p.padding[1], p.padding[0], p.padding[1]});
  if (s.op == Op::AvgPool2d) attr_int(n, "count_include_pad", p.count_include_pad ? 1 : 0);
  g.define(s.out[0], y, x.batch);
}

// x, running mean, running var, optional gamma and beta; ONNX needs a scale and a bias.
void batch_norm_inference(GraphBuilder& g, const Step& s) {
  const Value x = g.read(s.in[0]), mean = g.read(s.in[1]), var = g.read(s.in[2]);
  const Shape channels{x.shape[1]};
  const std::string scale = s.in.size() > 3 ? g.read(s.in[3]).name : g.filled(channels, 1, x.dtype);
  const std::string bias = s.in.size() > 4 ? g.read(s.in[4]).name : g.filled(channels, 0, x.dtype);
  const std::string y = g.fresh("batch_norm");
  attr_float(g.node("BatchNormalization", {x.name, scale, bias, mean.name, var.name}, {y}),
             "epsilon", s.attrs.as<BatchNormAttrs>().eps);
  g.define(s.out[0], y, x.batch);
}

// LayerNormalization over the trailing dimensions holding `cols` elements. Its mean and inverse
// standard deviation keep those dimensions as 1s; encore's drop them (a reshape where read).
void layer_norm(GraphBuilder& g, const Step& s) {
  const Value x = g.read(s.in[0]);
  const LayerNormAttrs& a = s.attrs.as<LayerNormAttrs>();
  int axis = x.shape.rank();
  for (int64_t inner = 1; inner < a.cols && axis > 0;) inner *= x.shape[--axis];
  Shape normalized(std::span<const int64_t>(x.shape.begin() + axis, x.shape.end()));
  if (normalized.numel() != a.cols || x.batch >= axis)
    g.fail(cat("normalises ", a.cols, " elements of ", x.shape,
               ", which are not its trailing dimensions without the batch"));
  std::vector<std::string> in{x.name};
  size_t next = 1;
  auto param = [&](uint8_t bit, double fill) {
    if (a.affine & bit) {
      const Operand& o = s.in[next++];
      return g.read({o.buf, normalized, o.dtype}).name;
    }
    return g.filled(normalized, fill, x.dtype);
  };
  in.push_back(param(kLayerNormGamma, 1));
  if (a.affine & kLayerNormBeta) in.push_back(param(kLayerNormBeta, 0));
  const std::string y = g.fresh("layer_norm"), mean = g.fresh("layer_norm_mean"),
                    rstd = g.fresh("layer_norm_rstd");
  onnx::NodeProto& n = g.node("LayerNormalization", in, {y, mean, rstd});
  attr_int(n, "axis", axis);
  attr_float(n, "epsilon", a.eps);
  g.define(s.out[0], y, x.batch);
  std::vector<int64_t> kept(x.shape.begin(), x.shape.end());
  for (int d = axis; d < x.shape.rank(); ++d) kept[d] = 1;
  g.define(s.out[1], mean, Shape(kept), x.batch);
  g.define(s.out[2], rstd, Shape(kept), x.batch);
}

// ids [...], weight [V, D] -> [..., D].
void embedding(GraphBuilder& g, const Step& s) {
  const Value ids = g.read(s.in[0]), w = g.read(s.in[1]);
  const std::string y = g.fresh("embedding");
  attr_int(g.node("Gather", {w.name, ids.name}, {y}), "axis", 0);
  g.define(s.out[0], y, ids.batch);
}

// arange_ (t[i] = i over a 1-D t): its values as a constant, or, where its length is the batch
// size, an int64 Range to the batch size at run time (cast to t's dtype).
void arange_values(GraphBuilder& g, const Step& s) {
  const Operand& t = s.in[0];
  if (g.batch_size() == 0 || t.shape.numel() != g.batch_size()) {
    g.define(t, g.constant(arange(t.shape.numel(), t.dtype, Device::cpu())), -1);
    return;
  }
  const std::string limit = g.node1("Reshape", {g.shape_tensor(t.shape, 0), g.ints({})}, "batch");
  std::string y =
      g.node1("Range", {g.scalar(0, DType::Int64), limit, g.scalar(1, DType::Int64)}, "range");
  if (t.dtype != DType::Int64) {
    const std::string cast = g.fresh("range");
    attr_int(g.node("Cast", {y}, {cast}), "to", onnx_dtype(t.dtype));
    y = cast;
  }
  g.define(t, y, 0);
}

// A constant: fixed, or shaped by the batch when one dimension has the traced batch size
// (zeros({x.size(0), n}) made inside the function). Only a dimension equal to the batch size is
// taken for it: one that is a multiple of it could as well be a constant.
void fill(GraphBuilder& g, const Step& s) {
  const Operand& t = s.in[0];
  const double value = s.attrs.as<ScalarAttrs>().value;
  int batch = -1;
  for (int d = 0; d < t.shape.rank() && g.batch_size() > 0; ++d)
    if (t.shape[d] == g.batch_size()) {
      if (batch >= 0)
        g.fail(cat("fills a tensor ", t.shape, " with two dimensions of the traced batch size ",
                   g.batch_size(), ": which one is the batch is unknown"));
      batch = d;
    }
  if (batch < 0) {
    g.define(t, g.filled(t.shape, value, t.dtype), -1);
    return;
  }
  const std::string y = g.fresh("fill");
  auto* a = g.node("ConstantOfShape", {g.shape_tensor(t.shape, batch)}, {y}).add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  const Tensor one = full({1}, value, t.dtype, Device::cpu());
  a->mutable_t()->set_data_type(onnx_dtype(t.dtype));
  a->mutable_t()->add_dims(1);
  a->mutable_t()->set_raw_data(one.raw_data(), one.nbytes());
  g.define(t, y, batch);
}

// dst <- src (converted to dst's dtype), a new value of dst's buffer.
void copy_into(GraphBuilder& g, const Step& s) {
  const Operand& dst = s.in[0];
  const Operand& src = s.in[1];
  if (src.shape.numel() != dst.shape.numel())
    g.fail(cat("copies ", src.shape, " into ", dst.shape, " (a broadcast copy)"));
  const Value v = g.read({src.buf, src.shape, src.dtype});
  const Value x = v.shape == dst.shape ? v : g.read({src.buf, dst.shape, src.dtype});
  std::string y;
  if (x.dtype == dst.dtype) {
    y = g.node1("Identity", {x.name}, "copy");
  } else {
    y = g.fresh("copy");
    attr_int(g.node("Cast", {x.name}, {y}), "to", onnx_dtype(dst.dtype));
  }
  g.define(dst, y, x.batch);
}

void add_into(GraphBuilder& g, const Step& s) {
  const Value a = g.read(s.in[0]), b = g.read(s.in[1]);
  g.define(s.in[0], g.node1("Add", {a.name, b.name}, "add"), a.batch);
}

}  // namespace

void emit_step(GraphBuilder& g, const Step& s) {
  switch (s.op) {
    case Op::Add:
      return binary(g, s, "Add");
    case Op::Sub:
      return binary(g, s, "Sub");
    case Op::Mul:
      return binary(g, s, "Mul");
    case Op::Div:
      return binary(g, s, "Div");
    case Op::Equal:
      return binary(g, s, "Equal");
    case Op::Greater:
      return binary(g, s, "Greater");
    case Op::AddScalar:
      return with_scalar(g, s, "Add", false);
    case Op::MulScalar:
      return with_scalar(g, s, "Mul", false);
    case Op::RsubScalar:
      return with_scalar(g, s, "Sub", true);
    case Op::DivScalar:
      return with_scalar(g, s, "Div", false);
    case Op::RdivScalar:
      return with_scalar(g, s, "Div", true);
    case Op::PowScalar:
      return with_scalar(g, s, "Pow", false);
    case Op::Neg:
      return unary(g, s, "Neg");
    case Op::Exp:
      return unary(g, s, "Exp");
    case Op::Log:
      return unary(g, s, "Log");
    case Op::Sqrt:
      return unary(g, s, "Sqrt");
    case Op::Relu:
      return unary(g, s, "Relu");
    case Op::Sigmoid:
      return unary(g, s, "Sigmoid");
    case Op::Tanh:
      return unary(g, s, "Tanh");
    case Op::Copy:
      return unary(g, s, "Identity");
    case Op::LeakyRelu: {
      const Value x = g.read(s.in[0]);
      const std::string y = g.fresh("leaky_relu");
      attr_float(g.node("LeakyRelu", {x.name}, {y}), "alpha", s.attrs.as<ScalarAttrs>().value);
      return g.define(s.out[0], y, x.batch);
    }
    case Op::Gelu:
      return gelu(g, s);
    case Op::Where: {
      const Value c = g.read(s.in[0]), a = g.read(s.in[1]), b = g.read(s.in[2]);
      return g.define(s.out[0], g.node1("Where", {c.name, a.name, b.name}, "where"),
                      broadcast_batch({&c, &a, &b}, s.out[0].shape.rank()));
    }
    case Op::Matmul:
      return matmul(g, s);
    case Op::Linear:
      return linear(g, s);
    case Op::Sum:
      return reduce(g, s, "ReduceSum");
    case Op::Mean:
      return reduce(g, s, "ReduceMean");
    case Op::Max:
      return reduce(g, s, "ReduceMax");
    case Op::Permute:
      return permute(g, s);
    case Op::BroadcastTo:
      return broadcast_to(g, s);
    case Op::Concat:
      return concat(g, s);
    case Op::Split:
      return split(g, s);
    case Op::Slice:
      return slice(g, s);
    case Op::Softmax:
      return axis_op(g, s, "Softmax");
    case Op::LogSoftmax:
      return axis_op(g, s, "LogSoftmax");
    case Op::Conv2d:
      return conv2d(g, s);
    case Op::MaxPool2d:
      return pool2d(g, s, "MaxPool");
    case Op::AvgPool2d:
      return pool2d(g, s, "AveragePool");
    case Op::BatchNormInference:
      return batch_norm_inference(g, s);
    case Op::LayerNorm:
      return layer_norm(g, s);
    case Op::Embedding:
      return embedding(g, s);
    case Op::Fill:
      return fill(g, s);
    case Op::Arange:
      return arange_values(g, s);
    case Op::CopyInplace:
      return copy_into(g, s);
    case Op::AddInplace:
      return add_into(g, s);
    case Op::BatchNorm:
    case Op::Dropout:
      g.fail(
          "is a training-mode op with no ONNX form here; export an entry traced with the "
          "modules in eval mode");
    default:
      g.fail(
          "has no ONNX mapping (losses, gradients, initialisers and optimizer updates are "
          "not part of an inference graph)");
  }
}

}  // namespace encore::onnx_export
