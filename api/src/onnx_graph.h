// What the ONNX exporter's parts share: the GraphBuilder that turns a traced forward's buffers
// into ONNX values (inputs, initializers, node outputs, reshaped views), and the op mapping that
// emits each step's nodes through it (onnx_ops.cc). Internal to api/.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "encore/onnx.h"
#include "onnx/onnx_pb.h"
#include "schedule/recording.h"

namespace encore::onnx_export {

using schedule::Operand;
using schedule::Step;

// One ONNX value: its name, its shape and dtype as traced, and which dimension carries the batch
// (-1: none). A dimension carrying the batch is the batch times a constant (the rows of a
// [batch * time, features] view, say).
struct Value {
  std::string name;
  Shape shape;
  DType dtype = DType::Float32;
  int batch = -1;
};

onnx::TensorProto_DataType onnx_dtype(DType dtype);

class GraphBuilder {
 public:
  // `names`: what to call the tensors the trace reads by reference, by their storage and offset
  // (module parameters and buffers); `batch_dims`: per argument, its batch dimension or -1.
  GraphBuilder(const schedule::ForwardTrace& trace, onnx::GraphProto& graph,
               std::map<std::pair<const void*, int64_t>, std::string> names,
               const OnnxOptions& options, std::vector<int> batch_dims);

  // Errors name the function and, while a step is emitted, the step and its op.
  void begin_step(int index, const Step& step);
  [[noreturn]] void fail(const std::string& why) const;

  // The value an operand reads: the graph input, initializer or node output that last wrote
  // its buffer, reshaped when the operand reads it with another shape.
  Value read(const Operand& o);
  // Makes `name` (of `shape`, the value a node wrote) what operand `o`'s buffer holds from now on.
  void define(const Operand& o, const std::string& name, int batch);
  void define(const Operand& o, const std::string& name, const Shape& shape, int batch);

  // A new value name, unique in the graph, starting with `hint`.
  std::string fresh(std::string_view hint);
  // Appends a node named after the current step.
  onnx::NodeProto& node(std::string_view op_type, std::vector<std::string> inputs,
                        std::vector<std::string> outputs);
  // A one-output node; returns its output's name.
  std::string node1(std::string_view op_type, std::vector<std::string> inputs,
                    std::string_view hint);

  // Initializers: int64 values (a 1-D tensor), and a scalar of `dtype`.
  std::string ints(const std::vector<int64_t>& values);
  std::string scalar(double value, DType dtype);
  // A constant of `dtype` filled with `value` (ones for a missing scale, say), shaped `shape`.
  std::string filled(const Shape& shape, double value, DType dtype);
  // A constant holding t's values (a host tensor).
  std::string constant(const Tensor& t);
  // The int64 shape tensor of `shape`, dimension `batch` (unless -1) computed from the graph's
  // batch size at run time.
  std::string shape_tensor(const Shape& shape, int batch);

  // The traced batch size (0 when no argument has a batch dimension).
  int64_t batch_size() const { return batch_size_; }
  // Which dimension of a value shaped `to` carries the batch, when a value shaped `from` with the
  // batch in dimension `batch` is reshaped to it: -1 when the reshape is not the same for every
  // batch size.
  int reshaped_batch(const Shape& from, int batch, const Shape& to) const;

  // Keeps `name` for a graph output (before any node is emitted, so no value takes it).
  void reserve(const std::string& name);
  // A graph output: `result` as `name` (reserved).
  void add_output(const Operand& result, const std::string& name);

 private:
  Value& current(int buf);
  std::string initializer(const Tensor& t, std::string name);
  void add_value_info(onnx::ValueInfoProto& info, const std::string& name, const Shape& shape,
                      DType dtype, int batch) const;

  const schedule::ForwardTrace& trace_;
  onnx::GraphProto& graph_;
  std::map<std::pair<const void*, int64_t>, std::string> names_;
  const OnnxOptions& options_;
  std::vector<Value> values_;  // per buffer: what it holds now (empty name: nothing yet)
  std::set<std::string> used_;
  std::map<std::pair<std::string, std::string>, Value> reshaped_;  // (value, shape) -> view
  std::string batch_source_;  // an input with a batch dimension, and which
  int batch_source_dim_ = -1;
  std::string batch_tensor_;  // [batch] as int64, made on first use
  int64_t batch_size_ = 0;
  int constants_ = 0;
  int step_ = -1;
  std::string step_label_;
};

// Emits the nodes of one forward step; an op without an ONNX form is an Error naming it.
void emit_step(GraphBuilder& g, const Step& step);

}  // namespace encore::onnx_export
