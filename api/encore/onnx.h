// ONNX export: the forward schedule of a static function's (or module's) eval entry as an ONNX
// model (opset 17, IR version 8), one node per recorded op.
//
//   model->eval();
//   encore::export_onnx(*model, "model.onnx", {.example_args = {x}});  // traces x if needed
//
//   auto infer = static_graph([&](const Tensor& x) { return (*model)(x); },
//                             {.name = "classifier", .arg_names = {"images"}, .modules = {model}});
//   { NoGradGuard g; infer(x); }                                       // an eval entry
//   encore::export_onnx(infer, "classifier.onnx");
//
// What is written: the arguments are the graph's inputs (named by the function's arg_names,
// else "input" or "input_<i>"), with the batch dimension (dim 0 of each by default, see
// OnnxOptions::batch_dims) symbolic, named "batch"; parameters and the other tensors the function
// reads are initializers named after the module tree ("c1.weight", "bn.running_mean"), or
// "constant_<k>" for tensors no module holds; the results are the outputs ("output",
// "output_<i>"). The model is checked with onnx::checker before it is written (to a temporary
// file, then renamed over `path`).
//
// Which entry: the most recently used planned one traced with the modules in eval mode (a
// function without modules: with grad mode off) and no backward inside; with example_args given,
// the one of their signature, traced first (grad mode off, the modules switched to eval for that
// call) when there is none. A forward called with grad mode on is planned only after its first
// backward, so inference calls meant for export run under NoGradGuard.
//
// The batch may be any size at run time: reshapes get -1 where the batch is, constants filled in
// the batch's shape are made from the input's shape. An op that has no ONNX form, or that would
// bake the traced batch size in (a slice or split across the batch), is an Error naming the op;
// so is a trace at batch size 0 or 1 (it cannot tell which dimension is the batch). What the
// trace cannot see stays as traced: a value the function computed on the host from the batch
// size is a constant of the export. A constant filled, or a batch-less tensor broadcast, to a
// shape with one dimension equal to the batch size takes that dimension for the batch (two such
// dimensions are an Error): trace at a batch size no other dimension of the model has.
// api/README.md lists the ops that map.
#pragma once

#include <string>
#include <vector>

#include "encore/nn.h"
#include "encore/static_graph.h"

namespace encore {

// The opset export_onnx writes (the default domain): ONNX 1.12's newest, which has
// LayerNormalization.
inline constexpr int kOnnxOpset = 17;

struct OnnxOptions {
  // Arguments to trace (grad mode off, modules in eval) when the function has no eval entry of
  // their signature; empty: use the most recently used eval entry.
  std::vector<Tensor> example_args = {};
  // Per argument, the dimension that is the batch (exported as the symbol batch_name), -1 for
  // none; missing entries are 0 (an argument of rank 0: none). {-1} on a one-argument function
  // exports every size as traced.
  std::vector<int> batch_dims = {};
  std::string batch_name = "batch";
  // Names of the graph's inputs and outputs, by position (missing ones: the defaults above);
  // more names than the function has arguments or results is an Error.
  std::vector<std::string> input_names = {};
  std::vector<std::string> output_names = {};
  std::string producer = "encore";
};

namespace detail {
void export_onnx(StaticCore& core, const std::string& path, const OnnxOptions& options);
}  // namespace detail

// Writes the eval forward of a static function as an ONNX model at `path` (see above). Throws
// Error naming the function, the op or the path when it cannot.
template <typename Fn>
void export_onnx(const StaticFunction<Fn>& fn, const std::string& path,
                 const OnnxOptions& options = {}) {
  detail::export_onnx(fn.core(), path, options);
}

// The same for a module: its ENCORE_STATIC_GRAPH forward, or, for a module without one, its
// one-tensor forward traced on options.example_args for the export.
void export_onnx(nn::Module& module, const std::string& path, const OnnxOptions& options = {});

}  // namespace encore
