// Optimizers: update parameters in place from their .grad, skipping parameters without one.
// Hyper-parameters and defaults follow Chainer and PyTorch.
//
//   optim::Adam opt(model->parameters(), {.lr = 1e-3});
//   loss.backward();
//   opt.step();
//   opt.zero_grad();
//
// Each update is a dispatched in-place op, so a tracer sees it: one call per parameter, or with
// `foreach` (the default on CUDA, as PyTorch's) one call for all parameters of a device and dtype,
// which CUDA runs as one kernel per 48 parameters instead of one per parameter. The
// values are the same either way. A static training step records what the optimizer dispatched; on
// the cpu one call per parameter lets each update run as soon as its gradient is final. State
// (momentum buffers, Adam moments and step counters) lives in tensors for the same reason.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "encore/functions.h"
#include "runtime/param_updaters.h"

namespace encore::optim {

// One tensor of an optimizer's state, as a checkpoint (encore/checkpoint.h) sees it.
struct StateSlot {
  std::string name;  // "<parameter index>.<state>", e.g. "0.m"
  Tensor* tensor;    // the member; undefined while lazily created state does not exist yet
  Shape shape;       // what the state is (or will be) when it exists
  DType dtype;
  Device device;
};

class Optimizer {
 public:
  // The parameters: at least one, each defined, floating, a leaf (a tensor computed from others
  // gets no .grad, and a step would never update it) and listed once; else an Error.
  explicit Optimizer(std::vector<Tensor> params);
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  void zero_grad(bool set_to_none = true);
  const std::vector<Tensor>& params() const { return params_; }
  // The step() calls so far, replays of a static training step included. A host value: read
  // inside a static function it would be baked into the replays, so a trace refuses it (as a
  // host read of a tensor); keep a count the step needs in a tensor it updates with ops.
  int64_t steps() const;

  // What a checkpoint saves and restores. kind() names the class ("Adam"); a checkpoint loads
  // only into an optimizer of the same kind, and one whose kind() is "" (the default for
  // optimizers defined outside encore) cannot be saved or loaded.
  virtual std::string kind() const { return ""; }
  // The hyper-parameters by name (a bool as 0 or 1), always the same names for one kind.
  virtual std::vector<std::pair<std::string, double>> hyper_parameters() const { return {}; }
  // Sets hyper-parameters by the names hyper_parameters() gives; an unknown name or a value the
  // constructor would reject is an Error, and leaves them as they were.
  virtual void set_hyper_parameters(const std::vector<std::pair<std::string, double>>& values);
  // The state tensors (none for plain SGD). A loader writes into a defined slot in place (a
  // static schedule bound to it stays valid) and creates an undefined one as described.
  virtual std::vector<StateSlot> state_slots() { return {}; }
  void set_steps(int64_t steps) { steps_->store(steps, std::memory_order_relaxed); }

 protected:
  // As the public constructor, with `kind` naming the optimizer in its errors.
  Optimizer(std::vector<Tensor> params, const char* kind);
  // A copy is another optimizer over the same parameters, with its own step count and state
  // tensors (equal to the original's at the copy, independent after); an assignment makes this
  // object such a copy of `other`. Protected, so that only a whole optimizer is copied: one
  // defined outside encore clones its own state tensors in its copy constructor and assignment.
  Optimizer(const Optimizer& other);
  Optimizer& operator=(const Optimizer& other);
  // Counts one step; inside a static function its replays count too.
  void count_step();
  // The attributes of this optimizer's update op for its hyper-parameters now. A static training
  // step watches them: a change between calls traces again, unless the replays may read them
  // at each call (replays_read_hyper_parameters). An optimizer defined outside encore overrides
  // it, and passes it to dispatch_updates, to have its hyper-parameters watched so. With the
  // default, none, a static step whose step() calls count_step() or dispatch_updates() watches
  // that it is the same optimizer and the values its hyper_parameters() lists (read at each
  // call; a change traces again); any other value its step() reads on the host is baked into
  // the trace, as any host code's is.
  virtual AttrBlob update_attrs() const { return {}; }
  // Whether a static step's replays may run its updates with update_attrs() as they are at each
  // call, so that a schedule between calls needs no new trace: step() dispatches nothing else
  // that depends on the hyper-parameters, and check_options() checks them as step() does. True
  // for encore's optimizers; one defined outside encore says so by overriding it.
  virtual bool replays_read_hyper_parameters() const { return false; }
  // Checks the hyper-parameters as step() does: an Error for a value out of range. Before a
  // replay runs with changed ones, a static step calls it, and traces again (the traced step()
  // raising its Error) when it refuses them.
  virtual void check_options() const {}
  // Dispatches `op` (an optimizer update, op_traits.h) for every parameter with a gradient;
  // inputs(i, grad, out) appends parameter i's group of inputs to `out`. With foreach (unset:
  // when the parameters are on CUDA) one call per device and dtype, else one per parameter.
  // Parameters that share a storage are always updated one call each.
  void dispatch_updates(
      Op op, const AttrBlob& attrs, std::optional<bool> foreach,
      const std::function<void(size_t, const Tensor&, std::vector<Tensor>&)>& inputs) const;

  std::vector<Tensor> params_;
  bool shared_storage_ =
      false;  // two parameters over one storage (one kernel must not update both)
  // Shared with the static schedules that recorded a step, which advance it on every replay (a
  // copy has its own).
  std::shared_ptr<std::atomic<int64_t>> steps_ = std::make_shared<std::atomic<int64_t>>(0);

 private:
  // While it lives: a static step traced before it was made sees the tensors it holds (a
  // parameter group added as a new optimizer traces again).
  ParamUpdaterRegistration registration_;
  friend class HyperGuard;
  // Held weakly by the guards of the static steps that recorded this optimizer: it ends with the
  // object, and an assignment gives the object a new one (the guards then see another
  // optimizer, whose state tensors the steps do not hold). A copy has its own.
  struct Token {
    std::shared_ptr<const char> p = std::make_shared<const char>(0);
    Token() = default;
    Token(const Token&) : Token() {}
    Token& operator=(const Token&) {
      p = std::make_shared<const char>(0);
      return *this;
    }
  };
  Token token_;
};

struct SGDOptions {
  double lr = 0.01;  // Chainer's default
  double weight_decay = 0;
  std::optional<bool> foreach = std::nullopt;  // one call for all parameters (unset: on CUDA)
};

// p -= lr * (g + weight_decay * p)
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options = {});
  void step() override;
  std::string kind() const override { return "SGD"; }
  std::vector<std::pair<std::string, double>> hyper_parameters() const override;
  void set_hyper_parameters(const std::vector<std::pair<std::string, double>>& values) override;
  SGDOptions options;

 protected:
  AttrBlob update_attrs() const override;
  bool replays_read_hyper_parameters() const override { return true; }
  void check_options() const override;
};

struct MomentumSGDOptions {
  double lr = 0.01;
  double momentum = 0.9;
  double weight_decay = 0;
  std::optional<bool> foreach = std::nullopt;  // one call for all parameters (unset: on CUDA)
};

// v = momentum * v - lr * (g + wd * p); p += v   (Chainer's MomentumSGD)
class MomentumSGD : public Optimizer {
 public:
  MomentumSGD(std::vector<Tensor> params, MomentumSGDOptions options = {});
  void step() override;
  std::string kind() const override { return "MomentumSGD"; }
  std::vector<std::pair<std::string, double>> hyper_parameters() const override;
  void set_hyper_parameters(const std::vector<std::pair<std::string, double>>& values) override;
  std::vector<StateSlot> state_slots() override;
  MomentumSGDOptions options;
  MomentumSGD(const MomentumSGD& other);  // its own velocities, equal to other's
  MomentumSGD& operator=(const MomentumSGD& other);

 protected:
  AttrBlob update_attrs() const override;
  bool replays_read_hyper_parameters() const override { return true; }
  void check_options() const override;

 private:
  std::vector<Tensor> velocity_;
};

struct AdamOptions {
  double lr = 1e-3;  // Chainer's alpha
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;                     // L2 added to the gradient (PyTorch Adam) ...
  bool decoupled = false;                      // ... or decoupled, p -= lr * wd * p (AdamW)
  std::optional<bool> foreach = std::nullopt;  // one call for all parameters (unset: on CUDA)
};

// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr * m_hat / (sqrt(v_hat) + eps)
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options = {});
  void step() override;
  std::string kind() const override { return "Adam"; }
  std::vector<std::pair<std::string, double>> hyper_parameters() const override;
  void set_hyper_parameters(const std::vector<std::pair<std::string, double>>& values) override;
  std::vector<StateSlot> state_slots() override;
  AdamOptions options;
  Adam(const Adam& other);             // its own moments and step counters, equal to other's
  Adam& operator=(const Adam& other);  // of the same kind (Adam, AdamW), else an Error

 protected:
  // As the public constructor, with `kind` naming the optimizer in its errors.
  Adam(std::vector<Tensor> params, AdamOptions options, const char* kind);
  AttrBlob update_attrs() const override;
  bool replays_read_hyper_parameters() const override { return true; }
  void check_options() const override;

 private:
  std::vector<Tensor> m_, v_, t_;  // t_: per-parameter step counters (int64 scalars)
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;                  // PyTorch's AdamW default
  std::optional<bool> foreach = std::nullopt;  // one call for all parameters (unset: on CUDA)
};

// Adam with decoupled weight decay, as torch.optim.AdamW: p -= lr * wd * p, then Adam's update.
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions o = {})
      : Adam(std::move(params), {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, true, o.foreach},
             "AdamW") {}
  std::string kind() const override { return "AdamW"; }
  // As Adam's, but decoupled is AdamW's own: a value other than 1 is an Error (Adam's L2 decay
  // is optim::Adam's).
  void set_hyper_parameters(const std::vector<std::pair<std::string, double>>& values) override;
};

}  // namespace encore::optim
