#include "encore/nn.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "api/src/routine.h"

namespace encore::nn {

Tensor Module::forward(const Tensor&) {
  fail(describe(), ": this module has no single-input forward; call its own operator()");
}

namespace {

std::atomic<uint64_t> g_structure{1};

}  // namespace

uint64_t module_structure_epoch() {
  return g_structure.load(std::memory_order_acquire);
}

void Module::register_parameter(std::string name, Tensor* member) {
  ENCORE_CHECK(member != nullptr && member->defined(), describe(), ": parameter '", name,
               "' is undefined");
  check_name(name, "parameter");
  ENCORE_CHECK(is_floating(member->dtype()), describe(), ": parameter '", name, "' ",
               member->shape(), " is ", member->dtype(), "; parameters must be floating");
  ENCORE_CHECK(member->is_leaf(), describe(), ": parameter '", name, "' ", member->shape(),
               " is not a leaf (it was computed from other tensors); register a detach()ed copy");
  member->set_requires_grad(true);
  params_.emplace_back(std::move(name), member);
  g_structure.fetch_add(1, std::memory_order_release);
}

void Module::check_name(const std::string& name, const char* what) const {
  ENCORE_CHECK(!name.empty() && name.find('.') == std::string::npos, describe(), ": ", what,
               " name '", name, "' must be non-empty and hold no '.'");
  auto taken = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& e) { return e.first == name; });
  };
  ENCORE_CHECK(!taken(params_) && !taken(buffers_) && !taken(children_), describe(), ": ", what,
               " name '", name, "' is already registered");
}

void Module::add_child(std::string name, std::shared_ptr<Module> m) {
  ENCORE_CHECK(m != nullptr, describe(), ": module '", name, "' is null");
  check_name(name, "module");
  // No cycles: every walk over the tree (parameters, train(), to()) would never end.
  for (const Module* below : m->modules())
    ENCORE_CHECK(below != this, describe(), ": module '", name, "' (", m->describe(),
                 ") holds this module; a module cannot be its own descendant");
  children_.emplace_back(std::move(name), std::move(m));
  g_structure.fetch_add(1, std::memory_order_release);
}

void Module::register_buffer(std::string name, Tensor* member) {
  ENCORE_CHECK(member != nullptr, describe(), ": buffer '", name, "' is null");
  check_name(name, "buffer");
  buffers_.emplace_back(std::move(name), member);
  g_structure.fetch_add(1, std::memory_order_release);
}

void Module::collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor*>>& out,
                     bool buffers) const {
  for (const auto& [name, p] : buffers ? buffers_ : params_)
    if (p->defined()) out.emplace_back(prefix + name, p);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out, buffers);
}

std::vector<std::pair<std::string, Tensor*>> Module::named_parameter_slots() const {
  std::vector<std::pair<std::string, Tensor*>> out;
  collect("", out, false);
  return out;
}

std::vector<std::pair<std::string, Tensor*>> Module::named_buffer_slots() const {
  std::vector<std::pair<std::string, Tensor*>> out;
  collect("", out, true);
  return out;
}

void Module::to(Device device) {
  // A tensor in several slots (a tied weight, a shared child's) moves once, and every slot gets
  // that one copy: the tie holds on the device.
  std::vector<std::pair<Tensor, Tensor>> moved;  // (before, after)
  auto move = [&](Tensor* slot, bool parameter) {
    if (slot->device() == device) return;
    const auto it = std::find_if(moved.begin(), moved.end(),
                                 [&](const auto& m) { return m.first.is_same(*slot); });
    if (it != moved.end()) {
      *slot = it->second;
      return;
    }
    Tensor now = parameter ? slot->detach().to(device) : slot->to(device);
    if (parameter) now.set_requires_grad(slot->requires_grad());
    moved.emplace_back(*slot, now);
    *slot = now;
  };
  for (auto& [name, p] : named_parameter_slots()) move(p, true);
  for (auto& [name, b] : named_buffer_slots()) move(b, false);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [name, p] : named_parameter_slots()) out.emplace_back(std::move(name), *p);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, p] : named_parameters())
    if (std::none_of(out.begin(), out.end(), [&](const Tensor& q) { return q.is_same(p); }))
      out.push_back(std::move(p));
  return out;
}

std::vector<Module*> Module::modules() {
  std::vector<Module*> out;
  auto visit = [&out](auto& self, Module* m) -> void {
    if (std::find(out.begin(), out.end(), m) != out.end()) return;  // a shared child: once
    out.push_back(m);
    for (auto& [name, child] : m->children_) self(self, child.get());
  };
  visit(visit, this);
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

bool Module::training_in_forward() const {
  if (Tracer* t = current_tracer()) t->on_mode_read(this, describe());
  return training_;
}

void Module::zero_grad(bool set_to_none) {
  detail::zero_grads(parameters(), set_to_none);
}

Linear::Linear(int64_t in_features, int64_t out_features, LinearOptions options) {
  ENCORE_CHECK(in_features > 0 && out_features > 0, "Linear: features must be positive, got ",
               in_features, " -> ", out_features);
  ENCORE_CHECK(is_floating(options.dtype), "Linear: dtype must be float32 or float64, it is ",
               options.dtype);
  weight = Tensor::empty({out_features, in_features}, options.dtype, options.device);
  const double fan_in = static_cast<double>(in_features);
  if (options.init == Init::PyTorch) {
    const double bound = 1.0 / std::sqrt(fan_in);
    uniform_(weight, -bound, bound);
    if (options.bias) bias = rand({out_features}, options.dtype, options.device, -bound, bound);
  } else {
    normal_(weight, 0.0, 1.0 / std::sqrt(fan_in));
    if (options.bias) bias = zeros({out_features}, options.dtype, options.device);
  }
  register_parameter("weight", &weight);
  if (options.bias) register_parameter("bias", &bias);
}

Tensor Linear::forward(const Tensor& x) {
  return F::linear(x, weight, bias);
}

std::string Linear::describe() const {
  return cat("Linear(", weight.defined() ? weight.size(1) : 0, " -> ",
             weight.defined() ? weight.size(0) : 0, bias.defined() ? "" : ", no bias", ")");
}

Embedding::Embedding(int64_t num, int64_t dim, std::optional<int64_t> padding_idx, DType dtype,
                     Device device) {
  ENCORE_CHECK(num > 0 && dim > 0, "Embedding: num and dim must be positive, got ", num, " x ",
               dim);
  ENCORE_CHECK(!padding_idx || (*padding_idx >= -num && *padding_idx < num),
               "Embedding: padding_idx ", padding_idx.value_or(0), " is outside [-", num, ", ", num,
               ")");
  if (padding_idx) padding_idx_ = *padding_idx < 0 ? *padding_idx + num : *padding_idx;
  ENCORE_CHECK(is_floating(dtype), "Embedding: dtype must be float32 or float64, it is ", dtype);
  // Drawn on the cpu, where the padding row can be zeroed in place, then moved.
  Tensor w = randn({num, dim}, dtype);
  if (padding_idx_) {
    const int64_t row = *padding_idx_ * dim;
    if (dtype == DType::Float32)
      std::fill_n(w.data<float>() + row, dim, 0.0f);
    else
      std::fill_n(w.data<double>() + row, dim, 0.0);
  }
  weight = w.to(device);
  register_parameter("weight", &weight);
}

std::string Embedding::describe() const {
  return cat("Embedding(", weight.size(0), ", ", weight.size(1),
             padding_idx_ ? cat(", padding_idx ", *padding_idx_) : std::string(), ")");
}

LayerNorm::LayerNorm(std::vector<int64_t> shape, double eps, bool elementwise_affine, DType dtype,
                     Device device)
    : normalized_shape_(std::move(shape)), eps_(eps) {
  ENCORE_CHECK(!normalized_shape_.empty(), "LayerNorm: normalized_shape must not be empty");
  for (int64_t d : normalized_shape_)
    ENCORE_CHECK(d > 0, "LayerNorm: normalized_shape ", sizes_text(normalized_shape_),
                 " must have positive dimensions");
  ENCORE_CHECK(eps >= 0, "LayerNorm: eps must be non-negative, it is ", eps);
  ENCORE_CHECK(is_floating(dtype), "LayerNorm: dtype must be float32 or float64, it is ", dtype);
  if (!elementwise_affine) return;
  const Shape s(normalized_shape_);
  weight = ones(s, dtype, device);
  bias = zeros(s, dtype, device);
  register_parameter("weight", &weight);
  register_parameter("bias", &bias);
}

std::string LayerNorm::describe() const {
  return cat("LayerNorm(", Shape(normalized_shape_), ", eps ", eps_,
             weight.defined() ? "" : ", no affine", ")");
}

std::string LeakyReLU::describe() const {
  return cat("LeakyReLU(", slope_, ")");
}

Sequential::Sequential(std::vector<std::shared_ptr<Module>> modules) {
  for (auto& m : modules) add(std::move(m));
}

Sequential& Sequential::add(std::shared_ptr<Module> m) {
  ENCORE_CHECK(m != nullptr, "Sequential: module ", modules_.size(), " is null");
  register_module(std::to_string(modules_.size()), m);
  modules_.push_back(std::move(m));
  return *this;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& m : modules_) h = (*m)(h);  // a child's static forward too
  return h;
}

std::string Sequential::describe() const {
  std::string s = "Sequential(";
  for (size_t i = 0; i < modules_.size(); ++i) s += cat(i ? ", " : "", modules_[i]->describe());
  return s + ")";
}

std::shared_ptr<Sequential> mlp(int64_t in, int64_t hidden, int64_t out, LinearOptions options) {
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Linear>(in, hidden, options), std::make_shared<ReLU>(),
      std::make_shared<Linear>(hidden, hidden, options), std::make_shared<ReLU>(),
      std::make_shared<Linear>(hidden, out, options)});
}

}  // namespace encore::nn
