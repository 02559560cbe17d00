// GraphBuilder: the buffers of a traced forward as ONNX values.
#include "api/src/onnx_graph.h"

namespace encore::onnx_export {

using schedule::Buffer;
using schedule::BufKind;

onnx::TensorProto_DataType onnx_dtype(DType dtype) {
  switch (dtype) {
    case DType::Float32:
      return onnx::TensorProto_DataType_FLOAT;
    case DType::Float64:
      return onnx::TensorProto_DataType_DOUBLE;
    case DType::Int32:
      return onnx::TensorProto_DataType_INT32;
    case DType::Int64:
      return onnx::TensorProto_DataType_INT64;
    case DType::Bool:
      return onnx::TensorProto_DataType_BOOL;
  }
  return onnx::TensorProto_DataType_UNDEFINED;
}

GraphBuilder::GraphBuilder(const schedule::ForwardTrace& trace, onnx::GraphProto& graph,
                           std::map<std::pair<const void*, int64_t>, std::string> names,
                           const OnnxOptions& options, std::vector<int> batch_dims)
    : trace_(trace), graph_(graph), names_(std::move(names)), options_(options) {
  values_.resize(trace.buffers.size());
  const size_t n = trace.arg_shapes.size();
  std::vector<std::string> inputs(n);
  for (size_t i = 0; i < n; ++i) {
    inputs[i] = i < options.input_names.size() && !options.input_names[i].empty()
                    ? options.input_names[i]
                : i < trace.arg_names.size() && !trace.arg_names[i].empty() ? trace.arg_names[i]
                : n == 1                                                    ? "input"
                                                                            : cat("input_", i);
    reserve(inputs[i]);
    const int b = batch_dims[i];
    if (b < 0) continue;
    const int64_t size = trace.arg_shapes[i][b];
    if (size < 2)
      fail(cat("input '", inputs[i], "' was traced at batch size ", size,
               ", where the trace cannot tell which dimension is the batch; trace at a batch "
               "size of 2 or more (OnnxOptions::example_args), or export fixed sizes "
               "(OnnxOptions::batch_dims -1)"));
    if (batch_size_ == 0) {
      batch_size_ = size;
      batch_source_ = inputs[i];
      batch_source_dim_ = b;
    } else if (size != batch_size_) {
      fail(cat("input '", inputs[i], "' has batch size ", size, " in dimension ", b, ", input '",
               batch_source_, "' ", batch_size_,
               "; the batch dimensions must agree (OnnxOptions::batch_dims)"));
    }
  }
  for (size_t i = 0; i < n; ++i)
    add_value_info(*graph_.add_input(), inputs[i], trace.arg_shapes[i], trace.arg_dtypes[i],
                   batch_dims[i]);
  for (size_t b = 0; b < trace.buffers.size(); ++b) {
    const Buffer& buf = trace.buffers[b];
    if (buf.kind == BufKind::Arg)
      values_[b] = {inputs[buf.index], trace.arg_shapes[buf.index], trace.arg_dtypes[buf.index],
                    batch_dims[buf.index]};
  }
}

void GraphBuilder::begin_step(int index, const Step& step) {
  step_ = index;
  step_label_ = cat("step ", index, " ", op_name(step.op));
}

void GraphBuilder::fail(const std::string& why) const {
  throw Error(cat("export_onnx: '", trace_.name, "' (", trace_.signature, ")",
                  step_ >= 0 ? ": " + step_label_ : std::string(), ": ", why));
}

Value& GraphBuilder::current(int buf) {
  Value& v = values_[buf];
  if (!v.name.empty()) return v;
  const Buffer& b = trace_.buffers[buf];
  switch (b.kind) {
    case BufKind::Param:
      v = {initializer(b.bound, trace_.param_names[b.index]), b.bound.shape(), b.bound.dtype(), -1};
      break;
    case BufKind::External: {
      const auto key = std::make_pair(static_cast<const void*>(b.bound.impl()->storage.get()),
                                      b.bound.impl()->offset);
      auto it = names_.find(key);
      v = {initializer(b.bound, it != names_.end() ? it->second : cat("constant_", constants_++)),
           b.bound.shape(), b.bound.dtype(), -1};
      break;
    }
    default:
      fail(cat("reads buffer b", buf, " before anything wrote it"));
  }
  return v;
}

std::string GraphBuilder::initializer(const Tensor& t, std::string name) {
  // Two buffers named alike (a tensor reached through two views) get distinct names.
  for (int k = 1; used_.contains(name); ++k) name = cat(name, "_", k);
  used_.insert(name);
  const Tensor host = t.device() == Device::cpu() ? t : t.to(Device::cpu());
  onnx::TensorProto& p = *graph_.add_initializer();
  p.set_name(name);
  p.set_data_type(onnx_dtype(host.dtype()));
  for (int64_t d : host.shape()) p.add_dims(d);
  p.set_raw_data(host.raw_data(), host.nbytes());
  return name;
}

int GraphBuilder::reshaped_batch(const Shape& from, int batch, const Shape& to) const {
  // The batch dimension of `from` spans the outer indices [pre, pre * from[batch]) of the flat
  // layout. The reshape is the same at every batch size when one dimension of `to` contains that
  // span whole (a merge, [B, T, D] -> [B * T, D]) or starts it with the batch outermost (a
  // split, [B * T, D] -> [B, T, D]).
  int64_t pre = 1;
  for (int d = 0; d < batch; ++d) pre *= from[d];
  const int64_t span = pre * from[batch];
  int64_t outer = 1;
  for (int a = 0; a < to.rank(); ++a) {
    const int64_t next = outer * to[a];
    const bool holds_batch = to[a] % batch_size_ == 0;
    if (holds_batch && pre % outer == 0 && next % span == 0) return a;
    if (holds_batch && outer == pre && span % next == 0) return a;
    outer = next;
  }
  return -1;
}

Value GraphBuilder::read(const Operand& o) {
  const Value& v = current(o.buf);
  if (v.dtype != o.dtype)
    fail(cat("reads ", v.name, " (", v.dtype, ") as ", o.dtype, "; a view cannot change dtype"));
  if (v.shape == o.shape) return v;
  if (v.shape.numel() != o.shape.numel())
    fail(cat("reads ", v.name, " ", v.shape, " as ", o.shape, ": not a view of it"));
  const auto key = std::make_pair(v.name, o.shape.str());
  if (auto it = reshaped_.find(key); it != reshaped_.end()) return it->second;
  std::vector<int64_t> target(o.shape.begin(), o.shape.end());
  int batch = -1;
  if (v.batch >= 0) {
    batch = reshaped_batch(v.shape, v.batch, o.shape);
    if (batch < 0)
      fail(cat("reads ", v.name, " ", v.shape, " (batch in dimension ", v.batch, ") as ", o.shape,
               ", which mixes the batch with other dimensions: no reshape serves every "
               "batch size"));
    target[batch] = -1;
  }
  Value out{node1("Reshape", {v.name, ints(target)}, v.name + "_view"), o.shape, o.dtype, batch};
  reshaped_.emplace(key, out);
  return out;
}

void GraphBuilder::define(const Operand& o, const std::string& name, int batch) {
  define(o, name, o.shape, batch);
}

void GraphBuilder::define(const Operand& o, const std::string& name, const Shape& shape,
                          int batch) {
  values_[o.buf] = {name, shape, o.dtype, batch};
}

std::string GraphBuilder::fresh(std::string_view hint) {
  std::string name(hint);
  for (int k = 1; used_.contains(name); ++k) name = cat(hint, "_", k);
  used_.insert(name);
  return name;
}

onnx::NodeProto& GraphBuilder::node(std::string_view op_type, std::vector<std::string> inputs,
                                    std::vector<std::string> outputs) {
  onnx::NodeProto& n = *graph_.add_node();
  n.set_op_type(std::string(op_type));
  n.set_name(fresh(step_ >= 0 ? cat(op_name(trace_.steps[step_].op), "_", step_, "/", op_type)
                              : std::string(op_type)));
  for (auto& i : inputs) n.add_input(std::move(i));
  for (auto& o : outputs) n.add_output(std::move(o));
  return n;
}

std::string GraphBuilder::node1(std::string_view op_type, std::vector<std::string> inputs,
                                std::string_view hint) {
  std::string out = fresh(hint);
  node(op_type, std::move(inputs), {out});
  return out;
}

std::string GraphBuilder::ints(const std::vector<int64_t>& values) {
  onnx::TensorProto& p = *graph_.add_initializer();
  p.set_name(fresh("ints"));
  p.set_data_type(onnx::TensorProto_DataType_INT64);
  p.add_dims(static_cast<int64_t>(values.size()));
  for (int64_t v : values) p.add_int64_data(v);
  return p.name();
}

std::string GraphBuilder::scalar(double value, DType dtype) {
  return filled(Shape{}, value, dtype);
}

std::string GraphBuilder::filled(const Shape& shape, double value, DType dtype) {
  return constant(full(shape, value, dtype, Device::cpu()));
}

std::string GraphBuilder::constant(const Tensor& t) {
  return initializer(t, cat("constant_", constants_++));
}

std::string GraphBuilder::shape_tensor(const Shape& shape, int batch) {
  std::vector<int64_t> dims(shape.begin(), shape.end());
  if (batch < 0) return ints(dims);
  if (batch_tensor_.empty()) {
    if (batch_source_.empty())
      fail(cat("a shape ", shape, " holds the batch, but no input has one"));
    onnx::NodeProto& n = node("Shape", {batch_source_}, {fresh("batch_size")});
    auto* start = n.add_attribute();
    start->set_name("start");
    start->set_type(onnx::AttributeProto::INT);
    start->set_i(batch_source_dim_);
    auto* end = n.add_attribute();
    end->set_name("end");
    end->set_type(onnx::AttributeProto::INT);
    end->set_i(batch_source_dim_ + 1);
    batch_tensor_ = n.output(0);
  }
  std::string rows = batch_tensor_;
  if (const int64_t k = shape[batch] / batch_size_; k != 1)
    rows = node1("Mul", {rows, ints({k})}, "batch_rows");
  std::vector<std::string> parts;
  if (batch > 0) parts.push_back(ints({dims.begin(), dims.begin() + batch}));
  parts.push_back(rows);
  if (batch + 1 < shape.rank()) parts.push_back(ints({dims.begin() + batch + 1, dims.end()}));
  if (parts.size() == 1) return parts[0];
  onnx::NodeProto& n = node("Concat", parts, {fresh("shape")});
  auto* axis = n.add_attribute();
  axis->set_name("axis");
  axis->set_type(onnx::AttributeProto::INT);
  axis->set_i(0);
  return n.output(0);
}

void GraphBuilder::add_value_info(onnx::ValueInfoProto& info, const std::string& name,
                                  const Shape& shape, DType dtype, int batch) const {
  info.set_name(name);
  auto* tensor = info.mutable_type()->mutable_tensor_type();
  tensor->set_elem_type(onnx_dtype(dtype));
  auto* dims = tensor->mutable_shape();
  for (int d = 0; d < shape.rank(); ++d) {
    auto* dim = dims->add_dim();
    if (d != batch)
      dim->set_dim_value(shape[d]);
    else if (shape[d] == batch_size_)
      dim->set_dim_param(options_.batch_name);
    else
      dim->set_dim_param(cat(options_.batch_name, "*", shape[d] / batch_size_));
  }
}

void GraphBuilder::reserve(const std::string& name) {
  if (!used_.insert(name).second) fail(cat("two inputs or outputs are named '", name, "'"));
}

void GraphBuilder::add_output(const Operand& result, const std::string& name) {
  step_ = -1;
  const Value v = read(result);
  node("Identity", {v.name}, {name});
  add_value_info(*graph_.add_output(), name, v.shape, v.dtype, v.batch);
}

}  // namespace encore::onnx_export
