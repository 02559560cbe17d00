// export_onnx: finds (or traces) the eval entry, builds the model, checks it, writes it.
#include "api/src/atomic_file.h"
#include "api/src/onnx_graph.h"
#include "onnx/checker.h"
#include "runtime/autograd.h"

namespace encore {
namespace {

// The tensors of the modules by storage and offset, named as checkpoints name them ("c1.weight",
// "bn.running_mean"; "modules[i]." before each name when the function watches several, as the
// static function's own messages name them).
std::map<std::pair<const void*, int64_t>, std::string> module_names(
    const std::vector<nn::Module*>& modules) {
  std::map<std::pair<const void*, int64_t>, std::string> names;
  for (size_t i = 0; i < modules.size(); ++i) {
    const std::string prefix = modules.size() == 1 ? "" : cat("modules[", i, "].");
    auto add = [&](const std::vector<std::pair<std::string, Tensor*>>& slots) {
      for (const auto& [name, slot] : slots)
        if (slot->defined())
          names.try_emplace({slot->impl()->storage.get(), slot->impl()->offset}, prefix + name);
    };
    add(modules[i]->named_parameter_slots());
    add(modules[i]->named_buffer_slots());
  }
  return names;
}

// Calls the function on `args` with grad mode off and its modules in eval mode, as an inference
// call would, restoring each module's own mode after (a frozen batch norm in a training model
// stays in eval).
void trace_for_inference(detail::StaticCore& core, std::span<const Tensor> args) {
  std::vector<std::pair<nn::Module*, bool>> modes;
  for (nn::Module* m : core.modules())
    for (nn::Module* d : m->modules()) modes.emplace_back(d, d->is_training());
  for (nn::Module* m : core.modules()) m->eval();
  // train() sets a module's children too: parents first, so each child ends with its own.
  auto restore = [&] {
    for (const auto& [m, training] : modes) m->train(training);
  };
  try {
    NoGradGuard no_grad;
    core.call(args, nullptr);
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

std::shared_ptr<const schedule::ForwardTrace> eval_trace(detail::StaticCore& core,
                                                         const OnnxOptions& options) {
  schedule::StaticGraph& graph = core.graph();
  const std::string& name = graph.config().name;
  const std::span<const Tensor> examples = options.example_args;
  if (examples.empty()) {
    auto trace = graph.eval_forward();
    ENCORE_CHECK(trace != nullptr, "export_onnx: '", name,
                 "' has no eval entry to export: call it once under NoGradGuard with its modules "
                 "in eval mode, or pass OnnxOptions::example_args");
    return trace;
  }
  for (size_t i = 0; i < examples.size(); ++i)
    ENCORE_CHECK(examples[i].defined(), "export_onnx: '", name, "': example argument ", i,
                 " is an undefined tensor");
  if (auto trace = graph.eval_forward(examples)) return trace;
  trace_for_inference(core, examples);
  auto trace = graph.eval_forward(examples);
  ENCORE_CHECK(trace != nullptr, "export_onnx: '", name, "': the call on the example arguments ",
               "left no schedule to export (",
               static_enabled() ? "its trace is unsafe: see stats().warnings"
                                : "static functions are switched off: ENCORE_STATIC=0",
               ")");
  return trace;
}

// Per argument, its batch dimension or -1, checked against the traced ranks.
std::vector<int> batch_dims(const schedule::ForwardTrace& trace, const OnnxOptions& options) {
  const size_t n = trace.arg_shapes.size();
  ENCORE_CHECK(options.batch_dims.size() <= n, "export_onnx: '", trace.name,
               "': OnnxOptions::batch_dims names ", options.batch_dims.size(),
               " arguments; the function takes ", n);
  std::vector<int> dims(n);
  for (size_t i = 0; i < n; ++i) {
    const int rank = trace.arg_shapes[i].rank();
    dims[i] = i < options.batch_dims.size() ? options.batch_dims[i] : rank > 0 ? 0 : -1;
    ENCORE_CHECK(dims[i] >= -1 && dims[i] < rank, "export_onnx: '", trace.name,
                 "': OnnxOptions::batch_dims[", i, "] is ", dims[i], " for an argument ",
                 trace.arg_shapes[i], "; expected -1 to ", rank - 1);
  }
  return dims;
}

void write_model(const onnx::ModelProto& model, const std::string& name, const std::string& path) {
  std::string bytes;
  ENCORE_CHECK(model.SerializeToString(&bytes), "export_onnx: '", name,
               "': the model does not serialise (over protobuf's 2 GiB limit?)");
  AtomicFile file(path, cat("export_onnx: '", name, "'"));
  file.write(bytes.data(), bytes.size());
  file.commit();
}

}  // namespace

namespace detail {

void export_onnx(StaticCore& core, const std::string& path, const OnnxOptions& options) {
  const std::shared_ptr<const schedule::ForwardTrace> trace = eval_trace(core, options);
  ENCORE_CHECK(options.output_names.size() <= trace->results.size(), "export_onnx: '", trace->name,
               "': OnnxOptions::output_names names ", options.output_names.size(),
               " outputs; the function returns ", trace->results.size());
  ENCORE_CHECK(options.input_names.size() <= trace->arg_shapes.size(), "export_onnx: '",
               trace->name, "': OnnxOptions::input_names names ", options.input_names.size(),
               " inputs; the function takes ", trace->arg_shapes.size());
  onnx::ModelProto model;
  model.set_ir_version(8);  // what opset 17 shipped with (ONNX 1.12)
  model.set_producer_name(options.producer);
  onnx::OperatorSetIdProto& opset = *model.add_opset_import();
  opset.set_domain("");
  opset.set_version(kOnnxOpset);
  onnx::GraphProto& graph = *model.mutable_graph();
  graph.set_name(trace->name);
  graph.set_doc_string(trace->signature);

  onnx_export::GraphBuilder g(*trace, graph, module_names(core.modules()), options,
                              batch_dims(*trace, options));
  const size_t n = trace->results.size();
  std::vector<std::string> outputs;
  for (size_t k = 0; k < n; ++k) {
    outputs.push_back(k < options.output_names.size() && !options.output_names[k].empty()
                          ? options.output_names[k]
                      : n == 1 ? "output"
                               : cat("output_", k));
    g.reserve(outputs.back());
  }
  for (size_t k = 0; k < trace->steps.size(); ++k) {
    g.begin_step(static_cast<int>(k), trace->steps[k]);
    onnx_export::emit_step(g, trace->steps[k]);
  }
  for (size_t k = 0; k < n; ++k) g.add_output(trace->results[k], outputs[k]);
  try {
    onnx::checker::check_model(model);
  } catch (const std::exception& e) {
    throw Error(
        cat("export_onnx: '", trace->name, "': the ONNX checker rejects the model: ", e.what()));
  }
  write_model(model, trace->name, path);
}

}  // namespace detail

void export_onnx(nn::Module& module, const std::string& path, const OnnxOptions& options) {
  if (auto* f = dynamic_cast<StaticForward*>(module.static_hook()))
    return detail::export_onnx(f->core(), path, options);
  ENCORE_CHECK(options.example_args.size() == 1, "export_onnx: ", module.describe(),
               " has no static forward (ENCORE_STATIC_GRAPH); its one-tensor forward is traced "
               "for the export on OnnxOptions::example_args, which holds ",
               options.example_args.size(), " tensors");
  // The module's forward as a static function of its own, for this export only.
  detail::StaticCore core({.name = "forward", .arg_names = {"input"}}, {&module},
                          [&module](std::span<const Tensor> args, std::vector<Tensor>& out) {
                            out.push_back(module.forward(args[0]));
                          });
  detail::export_onnx(core, path, options);
}

}  // namespace encore
