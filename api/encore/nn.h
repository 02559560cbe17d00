// Modules: parameters and submodules by name, train/eval mode, a forward.
//
//   auto model = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
//       std::make_shared<nn::Linear>(784, 100), std::make_shared<nn::ReLU>(),
//       std::make_shared<nn::Linear>(100, 10)});
//   Tensor logits = (*model)(x);
//   for (auto& [name, p] : model->named_parameters()) ...   // "0.weight", "0.bias", ...
//
// A module registers its parameters by address (register_parameter("weight", &weight_)), so a
// parameter replaced by assignment is seen by named_parameters(), as it is: assign one that
// requires grad (t.set_requires_grad(true), which register_parameter does), else it gets no
// gradient and no optimizer step (PyTorch refuses such an assignment). Modules are neither
// copyable nor movable; hold them by shared_ptr.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "encore/functions.h"

namespace encore::nn {

// What ENCORE_STATIC_GRAPH installs in a module: operator() goes through it (static_graph.h).
class StaticHook {
 public:
  virtual ~StaticHook() = default;
  virtual Tensor call(const Tensor& x) = 0;
};

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The single-input forward; modules with other signatures define their own call operator.
  virtual Tensor forward(const Tensor& x);
  // Calls forward(), or its static version when the class marks it ENCORE_STATIC_GRAPH.
  Tensor operator()(const Tensor& x) { return static_hook_ ? static_hook_->call(x) : forward(x); }

  // Parameters of this module and its descendants, depth first, named "child.param".
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  // The same, each tensor once (a shared child's or a tied weight's first place): what an
  // optimizer takes.
  std::vector<Tensor> parameters() const;
  // The members holding the parameters (defined ones), named as by named_parameters().
  std::vector<std::pair<std::string, Tensor*>> named_parameter_slots() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const {
    return children_;
  }
  // This module and its descendants, depth first, parents before their children, each once (a
  // shared child at its first place), as PyTorch's modules().
  std::vector<Module*> modules();

  // Sets train (true) or eval (false) mode on this module and its descendants.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // is_training() for a forward that depends on it (Dropout, BatchNorm2d): also tells a tracing
  // static function, which warns when the module is not among those it watches (its mode would
  // be baked into the replays, and eval() not seen).
  bool training_in_forward() const;

  // State that is not a parameter (batch norm's running statistics), named as parameters are.
  std::vector<std::pair<std::string, Tensor*>> named_buffer_slots() const;

  // Moves every parameter and buffer of this module and its descendants to `device` (a
  // parameter stays a leaf that requires grad; its gradient is dropped; a tensor held in several
  // places, a tied weight, stays one tensor). Create optimizers after
  // moving the model: they hold the parameters they were given.
  void to(Device device);

  // Clears the gradients of all parameters (drops them by default, as PyTorch does).
  void zero_grad(bool set_to_none = true);

  // A short description, e.g. "Linear(784 -> 100)".
  virtual std::string describe() const { return "Module"; }

  // The static forward installed by ENCORE_STATIC_GRAPH (null: plain eager).
  StaticHook* static_hook() const { return static_hook_; }
  void set_static_hook(StaticHook* hook) { static_hook_ = hook; }

 protected:
  // Registers a parameter held in a member of this module; marks it as requiring grad.
  void register_parameter(std::string name, Tensor* member);
  // Registers state held in a member (moved by to(), not trained).
  void register_buffer(std::string name, Tensor* member);
  // Registers a child module (not null; a name not taken by a parameter, buffer or child; not
  // this module nor one holding it).
  template <typename M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> m) {
    add_child(std::move(name), m);
    return m;
  }

 private:
  void add_child(std::string name, std::shared_ptr<Module> m);
  void check_name(const std::string& name, const char* what) const;
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor*>>& out,
               bool buffers) const;

  std::vector<std::pair<std::string, Tensor*>> params_, buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  StaticHook* static_hook_ = nullptr;
};

// A number that changes whenever any module gains a parameter, buffer or child (static functions
// watching modules then compare their parameters again).
uint64_t module_structure_epoch();

enum class Init {
  PyTorch,  // W, b ~ U(-1/sqrt(in), 1/sqrt(in))  (kaiming_uniform with a = sqrt(5))
  Chainer,  // W ~ N(0, 1/in) (LeCunNormal), b = 0
};

struct LinearOptions {
  bool bias = true;
  Init init = Init::PyTorch;
  DType dtype = DType::Float32;
  Device device = Device::cpu();
};

// y = x W^T + b, W [out, in].
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, LinearOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;

  Tensor weight;
  Tensor bias;  // undefined when options.bias is false
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return F::relu(x); }
  std::string describe() const override { return "ReLU"; }
};

// Looks up rows of `weight` [num, dim] (F::embedding): ids [...] -> [..., dim]. weight starts
// N(0, 1) as PyTorch's, its padding row zero; that row gets no gradient. padding_idx is in
// [-num, num), a negative one counting from the end (PyTorch's); padding_idx() gives the row,
// in [0, num). It is fixed at construction: a static function's trace holds it, so it is
// read-only.
class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim, std::optional<int64_t> padding_idx = std::nullopt,
            DType dtype = DType::Float32, Device device = Device::cpu());
  Tensor forward(const Tensor& ids) override { return F::embedding(ids, weight, padding_idx_); }
  std::string describe() const override;
  std::optional<int64_t> padding_idx() const { return padding_idx_; }

  Tensor weight;

 private:
  std::optional<int64_t> padding_idx_;
};

// Layer normalisation over the trailing dimensions `normalized_shape` (F::layer_norm), with
// parameters "weight" (ones) and "bias" (zeros) of that shape when elementwise_affine.
//   nn::LayerNorm ln({d_model});  // x [B, T, d_model] -> the same shape
// normalized_shape and eps are fixed at construction: a static function's trace holds them, so
// they are read-only.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::vector<int64_t> normalized_shape, double eps = 1e-5,
                     bool elementwise_affine = true, DType dtype = DType::Float32,
                     Device device = Device::cpu());
  Tensor forward(const Tensor& x) override {
    return F::layer_norm(x, normalized_shape_, weight, bias, eps_);
  }
  std::string describe() const override;
  const std::vector<int64_t>& normalized_shape() const { return normalized_shape_; }
  double eps() const { return eps_; }

  Tensor weight;  // undefined without elementwise_affine
  Tensor bias;

 private:
  std::vector<int64_t> normalized_shape_;
  double eps_;
};

class LeakyReLU : public Module {
 public:
  explicit LeakyReLU(double slope = 0.01) : slope_(slope) {}
  Tensor forward(const Tensor& x) override { return F::leaky_relu(x, slope_); }
  std::string describe() const override;

 private:
  double slope_;
};

class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& x) override { return F::sigmoid(x); }
  std::string describe() const override { return "Sigmoid"; }
};

class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override { return F::tanh(x); }
  std::string describe() const override { return "Tanh"; }
};

// Flattens all dimensions from start_dim on (keeps the batch dimension by default).
class Flatten : public Module {
 public:
  explicit Flatten(int start_dim = 1) : start_dim_(start_dim) {}
  Tensor forward(const Tensor& x) override { return F::flatten(x, start_dim_); }
  std::string describe() const override { return "Flatten"; }

 private:
  int start_dim_;
};

struct Conv2dOptions {
  Size2 stride = 1;
  Size2 padding = 0;
  Size2 dilation = 1;
  int groups = 1;
  bool bias = true;
  DType dtype = DType::Float32;
  Device device = Device::cpu();
};

// 2-D convolution, weight [out, in/groups, kh, kw]; initialised as PyTorch (W, b ~ U(-k, k),
// k = 1/sqrt(in/groups * kh * kw)).
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel, Conv2dOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;

  Tensor weight;
  Tensor bias;  // undefined when options.bias is false

 private:
  Conv2dOptions options_;
};

struct BatchNormOptions {
  double eps = 1e-5;
  double momentum = 0.1;
  bool affine = true;  // learn gamma (ones) and beta (zeros)
  DType dtype = DType::Float32;
  Device device = Device::cpu();
};

// Batch normalisation over the channels of [N,C,H,W] (also accepts [N,C]). Training uses and
// tracks batch statistics; eval uses running_mean/running_var.
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t channels, BatchNormOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;

  Tensor gamma;  // undefined when options.affine is false
  Tensor beta;
  Tensor running_mean;  // zeros; not a parameter (updated in place, no gradient)
  Tensor running_var;   // ones

 private:
  BatchNormOptions options_;
};

// Dropout in training mode, identity in eval mode.
class Dropout : public Module {
 public:
  explicit Dropout(double ratio = 0.5);
  Tensor forward(const Tensor& x) override { return F::dropout(x, ratio_, training_in_forward()); }
  std::string describe() const override;

 private:
  double ratio_;
};

// The window of a pooling module: kernel, stride (the kernel's by default) and padding.
class Pool2d : public Module {
 protected:
  // Checks the options; `name` names the module in the Error.
  Pool2d(const char* name, Size2 kernel, std::optional<Size2> stride, Size2 padding);
  // "<name>(kernel 2x2, stride 2x2, padding 0x0)"
  std::string describe_as(const char* name) const;

  Size2 kernel_;
  std::optional<Size2> stride_;
  Size2 padding_;
};

class MaxPool2d : public Pool2d {
 public:
  explicit MaxPool2d(Size2 kernel, std::optional<Size2> stride = std::nullopt, Size2 padding = 0)
      : Pool2d("MaxPool2d", kernel, stride, padding) {}
  Tensor forward(const Tensor& x) override { return F::max_pool2d(x, kernel_, stride_, padding_); }
  std::string describe() const override { return describe_as("MaxPool2d"); }
};

class AvgPool2d : public Pool2d {
 public:
  explicit AvgPool2d(Size2 kernel, std::optional<Size2> stride = std::nullopt, Size2 padding = 0)
      : Pool2d("AvgPool2d", kernel, stride, padding) {}
  Tensor forward(const Tensor& x) override { return F::avg_pool2d(x, kernel_, stride_, padding_); }
  std::string describe() const override { return describe_as("AvgPool2d"); }
};

// [N,C,H,W] -> [N,C].
class GlobalAvgPool2d : public Module {
 public:
  Tensor forward(const Tensor& x) override { return F::global_avg_pool2d(x); }
  std::string describe() const override { return "GlobalAvgPool2d"; }
};

// Applies its children in order; they are named "0", "1", ...
class Sequential : public Module {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<std::shared_ptr<Module>> modules);
  Sequential& add(std::shared_ptr<Module> m);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  size_t size() const { return modules_.size(); }
  Module& operator[](size_t i) const {
    ENCORE_CHECK(i < modules_.size(), "Sequential: index ", i, " is out of range for ",
                 modules_.size(), modules_.size() == 1 ? " module" : " modules");
    return *modules_[i];
  }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

// The 784-h-h-10 perceptron of the examples: Linear, ReLU, Linear, ReLU, Linear.
std::shared_ptr<Sequential> mlp(int64_t in, int64_t hidden, int64_t out,
                                LinearOptions options = {});

}  // namespace encore::nn
