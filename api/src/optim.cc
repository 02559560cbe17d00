#include "encore/optim.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>
#include <tuple>

#include "api/src/routine.h"

namespace encore::optim {

// A static training step's guard on the optimizer it recorded: the same object (not replaced by
// an assignment) and its update attributes (the hyper-parameters). The replays read those at
// each call where the optimizer allows it (checked as step() checks them); an optimizer that
// does not say its attributes (one defined outside encore) is watched for its identity and the
// values its hyper_parameters() lists.
class HyperGuard final : public HostGuard {
 public:
  explicit HyperGuard(const Optimizer& opt)
      : opt_(&opt),
        token_(opt.token_.p),
        attrs_(opt.update_attrs()),
        values_(opt.hyper_parameters()) {}

  std::string changed() const override {
    if (token_.expired()) return replaced();
    if (attrs_.type == AttrType::None) {
      // An optimizer defined outside encore: the values it lists (none listed, none compared).
      if (values_.empty()) return {};
    } else if (const AttrBlob now = opt_->update_attrs();
               std::memcmp(now.bytes, attrs_.bytes, sizeof now.bytes) == 0) {
      return {};
    }
    std::string what;
    const std::vector<std::pair<std::string, double>> values = opt_->hyper_parameters();
    if (values.size() != values_.size())
      return cat(whose(), " hyper-parameters changed (", values_.size(), " listed when traced, ",
                 values.size(), " now)");
    for (size_t i = 0; i < values.size(); ++i)
      if (std::bit_cast<uint64_t>(values[i].second) != std::bit_cast<uint64_t>(values_[i].second))
        what += cat(what.empty() ? "" : ", ", values[i].first, " ", values_[i].second, " -> ",
                    values[i].second);
    if (what.empty() && attrs_.type == AttrType::None) return {};
    return cat(whose(), " ", what.empty() ? "hyper-parameters changed" : what);
  }

  bool live() const override { return live_; }
  AttrBlob traced() const override { return attrs_; }
  // (The call checked unreplayable() first; an optimizer gone since gives the traced values.)
  AttrBlob current() const override { return token_.expired() ? attrs_ : opt_->update_attrs(); }

  std::string unreplayable() const override {
    if (!live_) return changed();
    if (token_.expired()) return replaced();
    const AttrBlob now = opt_->update_attrs();
    if (std::memcmp(now.bytes, attrs_.bytes, sizeof now.bytes) == 0) return {};
    // Values step() refuses: the call traces again, and the function's step() raises its Error.
    try {
      opt_->check_options();
    } catch (const Error& e) {
      return e.what();
    }
    return {};
  }

 private:
  // "Adam", or "the optimizer's" for one defined outside encore (no kind).
  std::string whose() const { return kind_.empty() ? "the optimizer's" : kind_; }
  std::string replaced() const {
    return cat(kind_.empty() ? "the" : kind_,
               " optimizer was replaced (assigned another optimizer)");
  }

  const Optimizer* opt_;
  std::weak_ptr<const char> token_;
  AttrBlob attrs_;
  std::vector<std::pair<std::string, double>> values_;
  std::string kind_ = opt_->kind();
  bool live_ = attrs_.type != AttrType::None && opt_->replays_read_hyper_parameters();
};

Optimizer::Optimizer(std::vector<Tensor> params) : Optimizer(std::move(params), "optimizer") {}

Optimizer::Optimizer(std::vector<Tensor> params, const char* kind)
    : params_(std::move(params)), registration_(&params_, kind) {
  // As PyTorch's "optimizer got an empty parameter list": a filter that left nothing to train.
  ENCORE_CHECK(!params_.empty(), kind, ": the parameter list is empty; give it at least one");
  // Sorted by storage, then tensor, then position: a tensor listed twice, and two tensors over one
  // storage, are neighbours.
  std::vector<std::tuple<const Storage*, const TensorImpl*, size_t>> seen;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    ENCORE_CHECK(p.defined(), kind, ": parameter ", i, " is undefined");
    ENCORE_CHECK(is_floating(p.dtype()), kind, ": parameter ", i, " ", p.shape(), " is ", p.dtype(),
                 "; parameters must be floating");
    // A tensor computed from others gets no .grad, so a step would never update it (PyTorch:
    // "can't optimize a non-leaf Tensor").
    ENCORE_CHECK(p.is_leaf(), kind, ": parameter ", i, " ", p.shape(),
                 " is not a leaf (it was computed from other tensors, and gets no .grad); "
                 "give the tensors it was computed from, or a detach()ed copy");
    seen.emplace_back(p.impl()->storage.get(), p.impl(), i);
  }
  std::sort(seen.begin(), seen.end());
  for (size_t k = 1; k < seen.size(); ++k) {
    const auto& [storage, impl, i] = seen[k];
    const auto& [prev_storage, prev_impl, prev_i] = seen[k - 1];
    // A parameter listed twice would be stepped twice per step (PyTorch warns; we refuse).
    ENCORE_CHECK(impl != prev_impl, kind, ": parameter ", i, " ", params_[i].shape(),
                 " is parameter ", prev_i, " listed again; list each parameter once");
    shared_storage_ = shared_storage_ || storage == prev_storage;
  }
}

// The token is the copy's own (Token's copy), and so is the step counter.
Optimizer::Optimizer(const Optimizer& other)
    : params_(other.params_),
      shared_storage_(other.shared_storage_),
      steps_(std::make_shared<std::atomic<int64_t>>(other.steps_->load())),
      registration_(&params_, other.registration_.kind()) {}

Optimizer& Optimizer::operator=(const Optimizer& other) {
  params_ = other.params_;
  registration_.renew();
  shared_storage_ = other.shared_storage_;
  // A new counter: the static steps that recorded this object's see another optimizer (token_).
  steps_ = std::make_shared<std::atomic<int64_t>>(other.steps_->load());
  token_ = other.token_;
  return *this;
}

void Optimizer::set_hyper_parameters(const std::vector<std::pair<std::string, double>>& values) {
  ENCORE_CHECK(values.empty(), "Optimizer::set_hyper_parameters: this optimizer has none, but '",
               values.front().first, "' was given");
}

int64_t Optimizer::steps() const {
  if (Tracer* t = current_tracer())
    t->on_host_value(cat(kind().empty() ? "an optimizer" : kind(), "'s steps()"));
  return steps_->load(std::memory_order_relaxed);
}

void Optimizer::count_step() {
  steps_->fetch_add(1, std::memory_order_relaxed);
  if (Tracer* t = current_tracer()) {
    t->on_count(steps_);
    // An optimizer defined outside encore may update its parameters with ops of its own, not
    // through dispatch_updates: its step is watched here.
    if (update_attrs().type == AttrType::None)
      t->on_host_guard(std::make_shared<HyperGuard>(*this));
  }
}

void Optimizer::dispatch_updates(
    Op op, const AttrBlob& attrs, std::optional<bool> foreach,
    const std::function<void(size_t, const Tensor&, std::vector<Tensor>&)>& inputs) const {
  if (Tracer* t = current_tracer()) t->on_host_guard(std::make_shared<HyperGuard>(*this));
  const size_t n = params_.size();
  const bool on_cuda = n > 0 && params_[0].device().type == DeviceType::CUDA;
  const bool grouped = !shared_storage_ && foreach.value_or(on_cuda);
  // One call per parameter, or per device and dtype in the order of each one's first parameter.
  std::vector<char> done(n, 0);
  std::vector<Tensor> call;
  for (size_t i = 0; i < n; ++i) {
    if (done[i]) continue;
    call.clear();
    for (size_t j = i; j < (grouped ? n : i + 1); ++j) {
      const Tensor& p = params_[j];
      if (done[j] || p.device() != params_[i].device() || p.dtype() != params_[i].dtype()) continue;
      done[j] = 1;
      if (const Tensor g = p.grad(); g.defined()) inputs(j, g, call);
    }
    if (!call.empty()) dispatch(op, call, {}, attrs);
  }
}

void Optimizer::zero_grad(bool set_to_none) {
  detail::zero_grads(params_, set_to_none);
}

namespace {
std::vector<Tensor> zeros_for(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  out.reserve(params.size());
  for (const Tensor& p : params) out.push_back(zeros(p.shape(), p.dtype(), p.device()));
  return out;
}

// A copy's state: the same values in tensors of its own (undefined ones stay undefined).
std::vector<Tensor> clone_state(const std::vector<Tensor>& state) {
  NoGradGuard no_grad;
  std::vector<Tensor> out;
  out.reserve(state.size());
  for (const Tensor& t : state) out.push_back(t.defined() ? clone(t) : Tensor());
  return out;
}

// Writes `values` into the members named in `members`; all names are checked first.
void set_named(const char* kind, const std::vector<std::pair<std::string, double*>>& members,
               const std::vector<std::pair<std::string, double>>& values) {
  for (const auto& [name, value] : values) {
    bool known = false;
    for (const auto& m : members) known = known || m.first == name;
    ENCORE_CHECK(known, kind, "::set_hyper_parameters: unknown hyper-parameter '", name, "'");
  }
  for (const auto& [name, value] : values)
    for (const auto& m : members)
      if (m.first == name) *m.second = value;
}

// Each option is checked on its own, and its Error names the optimizer, the option and its value
// (a NaN fails every comparison, so it is refused too).
void check_non_negative(const char* kind, const char* name, double value) {
  ENCORE_CHECK(value >= 0, kind, ": ", name, " must be non-negative, got ", value);
}

void check_adam_options(const char* kind, const AdamOptions& o) {
  check_non_negative(kind, "lr", o.lr);
  for (const auto& [name, beta] : {std::pair{"beta1", o.beta1}, std::pair{"beta2", o.beta2}})
    ENCORE_CHECK(beta >= 0 && beta < 1, kind, ": ", name, " must be in [0, 1), got ", beta);
  check_non_negative(kind, "eps", o.eps);
  check_non_negative(kind, "weight_decay", o.weight_decay);
}

void add_slots(std::vector<StateSlot>& out, const char* state, std::vector<Tensor>& tensors,
               const std::vector<Tensor>& params, bool scalar_int64 = false) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& p = params[i];
    out.push_back({std::to_string(i) + "." + state, &tensors[i], scalar_int64 ? Shape{} : p.shape(),
                   scalar_int64 ? DType::Int64 : p.dtype(), p.device()});
  }
}

void check_sgd_options(const SGDOptions& o) {
  check_non_negative("SGD", "lr", o.lr);
  check_non_negative("SGD", "weight_decay", o.weight_decay);
}

void check_momentum_options(const MomentumSGDOptions& o) {
  check_non_negative("MomentumSGD", "lr", o.lr);
  check_non_negative("MomentumSGD", "momentum", o.momentum);
  check_non_negative("MomentumSGD", "weight_decay", o.weight_decay);
}

}  // namespace

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : Optimizer(std::move(params), "SGD"), options(options) {
  check_sgd_options(options);
}

std::vector<std::pair<std::string, double>> SGD::hyper_parameters() const {
  return {{"lr", options.lr}, {"weight_decay", options.weight_decay}};
}

// Checks the new values on a copy: an Error leaves the options as they were.
void SGD::set_hyper_parameters(const std::vector<std::pair<std::string, double>>& values) {
  SGDOptions o = options;
  set_named("SGD", {{"lr", &o.lr}, {"weight_decay", &o.weight_decay}}, values);
  check_sgd_options(o);
  options = o;
}

AttrBlob SGD::update_attrs() const {
  return AttrBlob::of(SgdAttrs{options.lr, 0.0, options.weight_decay});
}

void SGD::check_options() const {
  check_sgd_options(options);
}

void SGD::step() {
  check_options();  // `options` is public: set since, it is checked here
  NoGradGuard no_grad;
  dispatch_updates(Op::SgdUpdate, update_attrs(), options.foreach,
                   [&](size_t i, const Tensor& g, std::vector<Tensor>& in) {
                     in.insert(in.end(), {params_[i], g});
                   });
  count_step();
}

MomentumSGD::MomentumSGD(std::vector<Tensor> params, MomentumSGDOptions options)
    : Optimizer(std::move(params), "MomentumSGD"), options(options), velocity_(zeros_for(params_)) {
  check_momentum_options(options);
}

MomentumSGD::MomentumSGD(const MomentumSGD& other)
    : Optimizer(other), options(other.options), velocity_(clone_state(other.velocity_)) {}

MomentumSGD& MomentumSGD::operator=(const MomentumSGD& other) {
  std::vector<Tensor> velocity = clone_state(other.velocity_);
  Optimizer::operator=(other);
  options = other.options;
  velocity_ = std::move(velocity);
  return *this;
}

std::vector<std::pair<std::string, double>> MomentumSGD::hyper_parameters() const {
  return {
      {"lr", options.lr}, {"momentum", options.momentum}, {"weight_decay", options.weight_decay}};
}

void MomentumSGD::set_hyper_parameters(const std::vector<std::pair<std::string, double>>& values) {
  MomentumSGDOptions o = options;
  set_named("MomentumSGD",
            {{"lr", &o.lr}, {"momentum", &o.momentum}, {"weight_decay", &o.weight_decay}}, values);
  check_momentum_options(o);
  options = o;
}

std::vector<StateSlot> MomentumSGD::state_slots() {
  std::vector<StateSlot> out;
  add_slots(out, "velocity", velocity_, params_);
  return out;
}

AttrBlob MomentumSGD::update_attrs() const {
  return AttrBlob::of(SgdAttrs{options.lr, options.momentum, options.weight_decay});
}

void MomentumSGD::check_options() const {
  check_momentum_options(options);
}

void MomentumSGD::step() {
  check_options();
  NoGradGuard no_grad;
  dispatch_updates(Op::MomentumSgdUpdate, update_attrs(), options.foreach,
                   [&](size_t i, const Tensor& g, std::vector<Tensor>& in) {
                     in.insert(in.end(), {params_[i], g, velocity_[i]});
                   });
  count_step();
}

Adam::Adam(std::vector<Tensor> params, AdamOptions options)
    : Adam(std::move(params), options, "Adam") {}

Adam::Adam(std::vector<Tensor> params, AdamOptions options, const char* kind)
    : Optimizer(std::move(params), kind),
      options(options),
      m_(zeros_for(params_)),
      v_(zeros_for(params_)) {
  check_adam_options(kind, options);
  for (const Tensor& p : params_) t_.push_back(zeros({}, DType::Int64, p.device()));
}

Adam::Adam(const Adam& other)
    : Optimizer(other),
      options(other.options),
      m_(clone_state(other.m_)),
      v_(clone_state(other.v_)),
      t_(clone_state(other.t_)) {}

Adam& Adam::operator=(const Adam& other) {
  ENCORE_CHECK(kind() == other.kind(), kind(), ": cannot be assigned a copy of ", other.kind(),
               " (its kind would not change)");
  std::vector<Tensor> m = clone_state(other.m_), v = clone_state(other.v_),
                      t = clone_state(other.t_);
  Optimizer::operator=(other);
  options = other.options;
  m_ = std::move(m);
  v_ = std::move(v);
  t_ = std::move(t);
  return *this;
}

std::vector<std::pair<std::string, double>> Adam::hyper_parameters() const {
  return {{"lr", options.lr},
          {"beta1", options.beta1},
          {"beta2", options.beta2},
          {"eps", options.eps},
          {"weight_decay", options.weight_decay},
          {"decoupled", options.decoupled ? 1.0 : 0.0}};
}

// Checks the new values on a copy: an Error leaves the options as they were.
void Adam::set_hyper_parameters(const std::vector<std::pair<std::string, double>>& values) {
  AdamOptions o = options;
  double decoupled = o.decoupled ? 1 : 0;
  set_named(kind().c_str(),
            {{"lr", &o.lr},
             {"beta1", &o.beta1},
             {"beta2", &o.beta2},
             {"eps", &o.eps},
             {"weight_decay", &o.weight_decay},
             {"decoupled", &decoupled}},
            values);
  ENCORE_CHECK(decoupled == 0 || decoupled == 1, kind(), ": decoupled must be 0 or 1, got ",
               decoupled);
  o.decoupled = decoupled != 0;
  check_adam_options(kind().c_str(), o);
  options = o;
}

// Checked before Adam's, which changes nothing when it refuses.
void AdamW::set_hyper_parameters(const std::vector<std::pair<std::string, double>>& values) {
  for (const auto& [name, value] : values)
    ENCORE_CHECK(name != "decoupled" || value == 1, kind(), ": decoupled must be 1, got ", value,
                 " (AdamW's weight decay is decoupled; optim::Adam has the coupled L2 decay)");
  Adam::set_hyper_parameters(values);
}

std::vector<StateSlot> Adam::state_slots() {
  std::vector<StateSlot> out;
  add_slots(out, "m", m_, params_);
  add_slots(out, "v", v_, params_);
  add_slots(out, "t", t_, params_, /*scalar_int64=*/true);
  return out;
}

AttrBlob Adam::update_attrs() const {
  return AttrBlob::of(AdamAttrs{options.lr, options.beta1, options.beta2, options.eps,
                                options.weight_decay, options.decoupled});
}

void Adam::check_options() const {
  const std::string k = kind();
  check_adam_options(k.c_str(), options);
  ENCORE_CHECK(options.decoupled || k != "AdamW", k,
               ": options.decoupled must be true (AdamW's weight decay is decoupled; optim::Adam "
               "has the coupled L2 decay)");
}

void Adam::step() {
  check_options();
  NoGradGuard no_grad;
  dispatch_updates(Op::AdamUpdate, update_attrs(), options.foreach,
                   [&](size_t i, const Tensor& g, std::vector<Tensor>& in) {
                     in.insert(in.end(), {params_[i], g, m_[i], v_[i], t_[i]});
                   });
  count_step();
}

}  // namespace encore::optim
