// static_graph: trace a function on its first call with an input signature, replay it after.
//
// Function form (anything, e.g. a whole training step):
//
//   auto step = encore::static_graph(
//       [&](const Tensor& x, const Tensor& t) {
//         Tensor loss = F::softmax_cross_entropy((*model)(x), t);
//         opt.zero_grad();
//         loss.backward();
//         opt.step();
//         return loss;
//       },
//       {.name = "step", .modules = {model}});
//   Tensor loss = step(x, t);         // first call: runs eagerly under a tracer
//   loss = step(x2, t2);              // same signature: replays the schedule, no user code
//
// Module form: one line inside the class makes operator() static; delete it for plain eager.
//
//   class Net : public nn::Module {
//    public:
//     Tensor forward(const Tensor& x) override { ... }
//     ENCORE_STATIC_GRAPH({.name = "net"});
//   };
//
// The signature of a call is the dtype, shape, device and requires-grad of every tensor
// argument, the grad mode, the train/eval mode of the modules, and an optional user key
// (StaticKey as the first argument). A new signature traces again; the cache keeps
// `cache_limit` entries (least recently used evicted). Outputs of a traced forward carry one
// autograd node for the whole subgraph; the first backward through it is recorded and later
// backwards replay it. ENCORE_STATIC=0 (or set_static_enabled(false)) runs everything eagerly;
// ENCORE_LOG=retrace prints every retrace with its reason; ENCORE_STATIC_VERIFY=N checks every
// Nth replay against an eager run (read when a static function is constructed: the default of
// its verify_every).
//
// Threads: a static function may be called from several threads at once (each call under way
// has its own arena; the cache and statistics are shared under a lock taken only to find the
// entry). What the calls write must not be shared: training threads use their own parameters.
// A signature is traced once; other threads' calls with it run eagerly meanwhile.
//
// Schedule dump: `step.schedule_text()` lists each cache entry (signature, arena bytes, lower
// bound, naive sum) and its forward and backward steps: op, operands with dtype and shape, where
// each lives (arena range, argument, parameter, external, .grad, own storage), in-place marks
// and random steps. `step.schedule_dot()` is the same as a Graphviz digraph (`dot -Tsvg`). For a
// module with ENCORE_STATIC_GRAPH: static_schedule_text(module), static_schedule_dot(module).
#pragma once

#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "encore/nn.h"
#include "schedule/static_graph.h"

namespace encore {

using schedule::DynamicDim;
using schedule::DynamicReport;
using schedule::DynamicShapes;
using schedule::EntryReport;
using schedule::LogSink;
using schedule::set_log_retraces;  // print each trace as it happens (ENCORE_LOG=retrace)
using schedule::set_log_sink;      // where warnings and trace lines go (stderr by default)
using schedule::OnUnsafe;
using schedule::RetraceEvent;
using schedule::StaticStats;

struct StaticOptions {
  std::string name = "static";  // names the function in messages and reports
  int cache_limit = 8;          // signatures kept; the least recently used is evicted
  // A trace that reads tensor values on the host (item(), to_vector(), data()) or creates
  // parameters: Error throws encore::Error; Eager warns and runs that signature eagerly.
  OnUnsafe on_unsafe = OnUnsafe::Error;
  int verify_every = 0;  // 0: off; N: every Nth replay is also run eagerly and compared
  std::vector<std::string> arg_names = {};  // argument names for messages, by position
  // Function form: modules whose train/eval mode joins the signature and whose parameters are
  // watched (a parameter replaced by another tensor is rebound, or retraced if its shape
  // differs). The module form adds its own module.
  std::vector<std::shared_ptr<nn::Module>> modules = {};
  // Dynamic shapes. Automatic (the default): an argument dimension whose value changes between
  // two traces becomes dynamic once the traces agree in everything but sizes, and every later
  // size is planned from the trace without running the function (the batch of a training step,
  // the height and width of an image). Where a slice of a dynamic dimension has a bound asked
  // alike at every traced size (`x[:, 1:]`, `x[:, :4]`, or T / 2 at 8 and 9), only sizes between
  // the traced ones are planned; a size beyond traces once and extends the family. Explicit: only
  // `dynamic_dims` ({argument, dimension}, by position) may, and they are planned at any size:
  // naming them says the function computes no slice bound from them. Off: every size is a signature
  // of its own. A dimension that cannot be dynamic (the traces show the function computing
  // something from it that they cannot follow) stays static, and stats().static_dims says why.
  DynamicShapes dynamic = DynamicShapes::Automatic;
  std::vector<DynamicDim> dynamic_dims = {};
  int size_limit = 16;  // sizes of a dynamic family kept planned (least recently used evicted)
};

// A key for non-tensor arguments: pass it first, `step(StaticKey{"lr=0.1"}, x, t)`.
struct StaticKey {
  std::string value;
};

// Runs every static function eagerly (false) or traced (true, the default unless
// ENCORE_STATIC=0). Returns the previous setting.
bool set_static_enabled(bool on);
bool static_enabled();
// Whether signatures traced from now on fuse each run of adjacent elementwise steps of their
// schedules into one step (the default, unless ENCORE_STATIC_FUSE=0): steps over one element
// count, reading operands of that count, one element, one row broadcast over the rows (a bias)
// or one value per row, and on the cpu row ops over the last axis among them (sum, mean, max over
// axis -1, softmax, log_softmax and their gradients), so softmax(scores * scale + mask) or
// x - mean(x, -1, true) is one step. On CUDA each run is one kernel compiled with NVRTC when the
// signature is traced (without NVRTC the steps stay apart and the schedule dump says why). Fused
// or not, a replay gives the same values bit for bit (a NaN aside: which NaN an operation on two
// NaNs returns may differ); off, the profiler and the schedule dump show every op on its own.
// Returns the previous setting.
bool set_static_fusion_enabled(bool on);
bool static_fusion_enabled();
// Whether signatures traced from now on move each optimizer update (SGD, momentum SGD, Adam) of a
// whole training step to right after the last step it depends on (its gradient's last write, the
// last read of the old parameter), instead of after the whole backward, so it reads its gradient
// while that is still in cache; and a gradient zeroed by zero_grad(false) gets its first
// contribution in one step instead of a fill and an add. On by default
// (ENCORE_STATIC_EARLY_UPDATES=0 starts it off); only independent steps change order and c + 0 is
// 0 + c, so the values are the same bit for bit. Returns the previous setting.
bool set_static_early_updates_enabled(bool on);
bool static_early_updates_enabled();
// Whether signatures traced from now on get a lane schedule: when num_threads() is 2, a cpu
// replay runs independent steps (a layer's weight and input gradients, the updates of different
// parameters) on two threads at once, and a large step on both; a CUDA replay's graphs hold the
// lanes on several streams (cuda::graph_streams()), which the device runs side by side. On by
// default (ENCORE_STATIC_LANES=0 starts it off); every kernel computes its chunks as at two
// threads eagerly, and on CUDA what it computes on one stream, so the values are the same bit
// for bit. Returns the previous setting.
bool set_static_lanes_enabled(bool on);
bool static_lanes_enabled();
// Whether signatures traced from now on lay a convolution's output out padded in their cpu plans
// where only stride-1 convolutions (the next layer's forward and weight gradient) read it: the
// writer puts its rows inside a zero border, and the readers skip the padded copy they make
// eagerly. On by default (ENCORE_STATIC_PADDED=0 starts it off); the kernels read the same values
// in the same order, so the values are the same bit for bit. Returns the previous setting.
bool set_static_padded_layouts_enabled(bool on);
bool static_padded_layouts_enabled();
// Whether signatures traced from now on make fewer passes over activations in their cpu plans: a
// linear or conv2d followed by an activation (relu, leaky_relu, sigmoid, tanh, gelu) that alone
// reads its output becomes one step that applies the activation as it writes; an activation's
// gradient is applied by the product computing the gradient it reads; an outer product (a weight
// gradient at batch 1) is added into the gradient it accumulates into as it is computed; a
// linear's bias gradient (sum(gy, 0)) is computed in the step of its weight gradient (gy^T x);
// max_pool2d(relu(x)) runs as relu(max_pool2d(x)), its backward likewise. CUDA plans fold the
// first two and the bias gradients where the product is small enough for encore's own GEMM kernel
// (runtime/small_gemm.h), which applies the activation or its gradient as it stores each output,
// and sums gy's columns in the order of CUDA's Sum. On by default
// (ENCORE_STATIC_FOLD=0 starts it off); each element goes through the same element functions in the
// same order, so the values are the same bit for bit. The schedule dump marks each rewritten step.
// Returns the previous setting.
bool set_static_fold_activations_enabled(bool on);
bool static_fold_activations_enabled();
// Whether signatures traced from now on fold the steps that compute constants from values the
// function makes itself (a causal mask made from arange, positions from a range): such a step's
// results are bound to their values at the trace and the step is not replayed. On by default
// (ENCORE_STATIC_FOLD_CONSTANTS=0 starts it off); a replay reads the values eager recomputes, so
// the results are the same bit for bit. The schedule dump counts the folded steps. Returns the
// previous setting.
bool set_static_fold_constants_enabled(bool on);
bool static_fold_constants_enabled();
// Whether signatures traced from now on fold chains of layout steps (permute, slice, split,
// concat, reshapes) whose intermediate values only the chain reads into one strided copy, moving
// each element once from where the chain's first step read it. On by default where fusion is on
// (ENCORE_STATIC_FOLD_LAYOUTS=0, or ENCORE_STATIC_FUSE=0, starts it off); elements are moved, not
// computed, so the results are the same bit for bit. The schedule dump names the steps each copy
// stands for. Returns the previous setting.
bool set_static_fold_layouts_enabled(bool on);
bool static_fold_layouts_enabled();
// Whether signatures traced from now on run a linear's Adam updates inside the step computing its
// weight and bias gradients on the cpu too. A CUDA plan does so wherever the gradients run on
// encore's small GEMM kernels (with set_static_fold_activations_enabled): the update's kernel, a
// training step's last, leaves its critical path. On the cpu the step runs the same kernels in
// turn, and on two lanes the updates no longer run beside the next gradients' products, so it is
// off by default there (ENCORE_STATIC_FOLD_CPU_UPDATES=1 starts it on). The values are the same
// bit for bit either way. Returns the previous setting.
bool set_static_fold_cpu_updates_enabled(bool on);
bool static_fold_cpu_updates_enabled();
// Whether calls from now on may make argument dimensions dynamic (StaticOptions::dynamic) and be
// served by the dynamic families made so far; off (ENCORE_STATIC_DYNAMIC=0 starts it off), every
// size traces once, as with DynamicShapes::Off. Returns the previous setting.
bool set_static_dynamic_enabled(bool on);
bool static_dynamic_enabled();
// Whether signatures traced from now on put a red zone (guard bytes of a known fill) after each
// block of their arena and check, after every replayed step, the guards of what it wrote: an
// overrun that stays inside the arena (invisible to AddressSanitizer) raises an Error naming the
// step and the buffer. Off by default (ENCORE_STATIC_REDZONE=1 starts it on); a function in
// verify mode always has them. Costs memory and a check per step; results do not change.
// Returns the previous setting.
bool set_static_redzones_enabled(bool on);
bool static_redzones_enabled();

// Statistics of every live static function in the process.
std::vector<StaticStats> static_graph_report();
// The same as a human-readable table.
std::string static_graph_report_table();

namespace detail {

// The type-erased part of a static function (one per StaticFunction or module).
class StaticCore {
 public:
  StaticCore(StaticOptions options, std::vector<nn::Module*> modules,
             schedule::StaticGraph::Body body);
  std::vector<Tensor> call(std::span<const Tensor> args, const std::string* key);
  schedule::StaticGraph& graph() { return *graph_; }
  // The modules whose mode joins the signature and whose parameters are watched.
  const std::vector<nn::Module*>& modules() const { return modules_; }

 private:
  // The signature's mode: the train bits of the modules and all their descendants (0 all eval,
  // 1 all train, else 2 + a code of the mix).
  int64_t tree_mode() const;
  std::string mode_text(int64_t mode) const;  // Config::mode_text

  std::vector<std::shared_ptr<nn::Module>> owned_;  // options.modules, kept alive
  std::vector<nn::Module*> modules_;
  std::unique_ptr<schedule::StaticGraph> graph_;
};

template <typename T>
struct IsTuple : std::false_type {};
template <typename... T>
struct IsTuple<std::tuple<T...>> : std::true_type {};
template <typename A, typename B>
struct IsTuple<std::pair<A, B>> : std::true_type {};

template <typename R>
void flatten_result(R&& r, std::vector<Tensor>& out) {
  using D = std::decay_t<R>;
  if constexpr (std::is_same_v<D, Tensor>) {
    out.push_back(std::forward<R>(r));
  } else if constexpr (std::is_same_v<D, std::vector<Tensor>>) {
    for (auto& t : r) out.push_back(t);
  } else {
    static_assert(IsTuple<D>::value, "a static function returns Tensor, std::vector<Tensor>, "
                                     "a std::tuple or std::pair of Tensors, or void");
    std::apply([&out](auto&&... t) { (out.push_back(t), ...); }, r);
  }
}

// `const Tensor&`, once per index (a parameter pack of N tensor parameters).
template <size_t>
using TensorParam = const Tensor&;

// Whether Fn can be called with N tensors.
template <typename Fn, size_t N>
inline constexpr bool takes_tensors = []<size_t... I>(std::index_sequence<I...>) {
  return std::is_invocable_v<Fn&, TensorParam<I>...>;
}
(std::make_index_sequence<N>());

inline constexpr size_t kMaxStaticArgs = 16;

template <typename R>
R unflatten_result(std::vector<Tensor>& v) {
  if constexpr (std::is_same_v<R, Tensor>) {
    return std::move(v.at(0));
  } else if constexpr (std::is_same_v<R, std::vector<Tensor>>) {
    return std::move(v);
  } else {
    return [&v]<size_t... I>(std::index_sequence<I...>) {
      return R{std::move(v.at(I))...};
    }
    (std::make_index_sequence<std::tuple_size_v<R>>());
  }
}

// Calls fn with the call's arguments as separate parameters: the overload taking that many
// tensors (a functor may have several). False when fn takes no N tensors.
template <size_t N, typename Fn>
bool call_n(Fn& fn, std::span<const Tensor> args, std::vector<Tensor>& out) {
  if constexpr (takes_tensors<Fn, N>) {
    [&]<size_t... I>(std::index_sequence<I...>) {
      using R = std::invoke_result_t<Fn&, TensorParam<I>...>;
      if constexpr (std::is_void_v<R>)
        fn(args[I]...);
      else
        flatten_result(fn(args[I]...), out);
    }
    (std::make_index_sequence<N>());
    return true;
  } else {
    return false;
  }
}

template <typename Fn>
void call_with(Fn& fn, std::span<const Tensor> args, std::vector<Tensor>& out,
               const std::string& name) {
  const bool called = [&]<size_t... N>(std::index_sequence<N...>) {
    return ((args.size() == N && call_n<N>(fn, args, out)) || ...);
  }
  (std::make_index_sequence<kMaxStaticArgs + 1>());
  ENCORE_CHECK(called, "static function '", name, "': called with ", args.size(),
               " tensor arguments; its function does not take ", args.size(), " tensors");
}

}  // namespace detail

// A static function over tensor arguments. Copying shares the cache.
template <typename Fn>
class StaticFunction {
 public:
  StaticFunction(Fn fn, StaticOptions options) : fn_(std::make_shared<Fn>(std::move(fn))) {
    std::vector<nn::Module*> modules;
    for (auto& m : options.modules) modules.push_back(m.get());
    std::string name = options.name;
    core_ = std::make_shared<detail::StaticCore>(std::move(options), std::move(modules),
                                                 make_body(std::move(name)));
  }

  template <typename... Args>
  auto operator()(const Args&... args) {
    return invoke(nullptr, args...);
  }
  template <typename... Args>
  auto operator()(const StaticKey& key, const Args&... args) {
    return invoke(&key.value, args...);
  }

  StaticStats stats() const { return core_->graph().stats(); }
  // Each cache entry's forward and backward schedules as text, and as a Graphviz digraph.
  std::string schedule_text() const { return core_->graph().schedule_text(); }
  std::string schedule_dot() const { return core_->graph().schedule_dot(); }
  // Drops every cache entry (the next call traces).
  void clear() { core_->graph().clear(); }
  schedule::StaticGraph& graph() { return core_->graph(); }
  // The type-erased function (its cache and modules), for exporters (export_onnx).
  detail::StaticCore& core() const { return *core_; }

 private:
  template <typename... Args>
  auto invoke(const std::string* key, const Args&... args) {
    static_assert((std::is_convertible_v<const Args&, const Tensor&> && ...),
                  "static function arguments are Tensors; pass other values through the "
                  "closure and a StaticKey");
    static_assert(sizeof...(Args) <= detail::kMaxStaticArgs,
                  "a static function takes up to 16 tensor arguments");
    static_assert(detail::takes_tensors<Fn, sizeof...(Args)>,
                  "a static function is called with the tensors its function takes: as many "
                  "arguments as the function has parameters, each a Tensor (see the "
                  "instantiation context for the arguments given)");
    if constexpr (detail::takes_tensors<Fn, sizeof...(Args)>) {
      using R = std::invoke_result_t<Fn&, detail::TensorParam<sizeof(Args)>...>;
      const Tensor targs[] = {Tensor(args)..., Tensor()};
      std::vector<Tensor> out = core_->call(std::span<const Tensor>(targs, sizeof...(Args)), key);
      if constexpr (!std::is_void_v<R>) return detail::unflatten_result<R>(out);
    }
  }

  schedule::StaticGraph::Body make_body(std::string name) {
    std::shared_ptr<Fn> fn = fn_;
    return [fn, name = std::move(name)](std::span<const Tensor> args, std::vector<Tensor>& out) {
      detail::call_with(*fn, args, out, name);
    };
  }

  std::shared_ptr<Fn> fn_;
  std::shared_ptr<detail::StaticCore> core_;
};

template <typename Fn>
StaticFunction<Fn> static_graph(Fn fn, StaticOptions options = {}) {
  return StaticFunction<Fn>(std::move(fn), std::move(options));
}

// The member ENCORE_STATIC_GRAPH declares: makes its module's operator() run forward() as a
// static function with this module's own cache. A forward may take several tensors and return
// several (a std::tuple or std::pair of Tensors, or a std::vector<Tensor>): the module's
// operator() takes and returns what its forward does.
class StaticForward final : public nn::StaticHook {
 public:
  template <typename M>
  explicit StaticForward(M* module, StaticOptions options = {})
      : StaticForward(static_cast<nn::Module*>(module), std::move(options), forward_body(module)) {}
  ~StaticForward() override;
  // The one-tensor call of nn::Module::operator() (a module used through a Module pointer).
  Tensor call(const Tensor& x) override;
  // The call of the operator() that ENCORE_STATIC_GRAPH declares: module.forward(args...)'s
  // result, through the cache.
  // `key`: a StaticKey's value, or null.
  template <typename M, typename... A>
  auto call_as(M& module, const std::string* key, const A&... args) {
    using R = decltype(module.forward(args...));
    const Tensor targs[] = {Tensor(args)..., Tensor()};
    std::vector<Tensor> out = core_.call(std::span<const Tensor>(targs, sizeof...(A)), key);
    if constexpr (!std::is_void_v<R>) return detail::unflatten_result<R>(out);
  }
  StaticStats stats() const { return core_.graph().stats(); }
  schedule::StaticGraph& graph() { return core_.graph(); }
  detail::StaticCore& core() const { return core_; }

 private:
  StaticForward(nn::Module* module, StaticOptions options, schedule::StaticGraph::Body body);
  // Calls the forward overload of M taking as many tensors as the call has.
  template <typename M>
  static schedule::StaticGraph::Body forward_body(M* module) {
    return [module](std::span<const Tensor> args, std::vector<Tensor>& out) {
      auto forward = [module](const auto&... a) -> decltype(module->forward(a...)) {
        return module->forward(a...);
      };
      detail::call_with(forward, args, out, "forward");
    };
  }

  nn::Module* module_;
  mutable detail::StaticCore core_;
};

// The statistics of a module's ENCORE_STATIC_GRAPH forward; throws Error when it has none.
StaticStats static_stats(const nn::Module& module);
// Drops the cache of a module's static forward (the next call traces).
void static_clear(nn::Module& module);
// The schedules of a module's static forward as text and as a Graphviz digraph (see
// StaticFunction::schedule_text); throw Error when it has none.
std::string static_schedule_text(const nn::Module& module);
std::string static_schedule_dot(const nn::Module& module);

}  // namespace encore

// Inside a Module subclass (a class at namespace scope: the operator() it declares is a
// template, which a local class cannot hold), in its public part: `ENCORE_STATIC_GRAPH();` or
// `ENCORE_STATIC_GRAPH({.name = "net"});`. Declares the static forward and an operator() taking
// and returning what the class's forward does (one tensor or several), with or without a
// StaticKey first. What forward reads on the host (a member flag, an option) is baked into the
// trace: a forward that branches on such a value is called with a key naming it,
// `net(StaticKey{net.logits ? "logits" : "probs"}, x)`.
#define ENCORE_STATIC_GRAPH(...)                                                               \
  template <typename... EncoreArgs>                                                            \
  auto operator()(const EncoreArgs&... encore_args)->decltype(this->forward(encore_args...)) { \
    return encore_static_graph_.call_as(*this, nullptr, encore_args...);                       \
  }                                                                                            \
  template <typename... EncoreArgs>                                                            \
  auto operator()(const ::encore::StaticKey& encore_key, const EncoreArgs&... encore_args)     \
      ->decltype(this->forward(encore_args...)) {                                              \
    return encore_static_graph_.call_as(*this, &encore_key.value, encore_args...);             \
  }                                                                                            \
  ::encore::StaticForward encore_static_graph_ {                                               \
    this __VA_OPT__(, ) __VA_ARGS__                                                            \
  }
