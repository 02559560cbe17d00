#include "runtime/autograd.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <vector>

#include "runtime/profiler.h"

namespace encore {
namespace {

thread_local bool t_grad_enabled = true;
std::atomic<uint64_t> g_sequence{0};
std::atomic<uint64_t> g_hook_ids{1};
std::atomic<uint64_t> g_hooks_epoch{0};
std::atomic<uint64_t> g_passes{1};
std::atomic<uint64_t> g_walks{1};
// The outermost backward pass running on this thread: its number and queued callbacks.
thread_local int t_depth = 0;
thread_local uint64_t t_pass = 0;
thread_local std::vector<std::function<void()>> t_callbacks;

void run_grad_hooks(TensorImpl* leaf) {
  if (!leaf->grad_hooks) return;
  const Tensor t{IntrusivePtr<TensorImpl>(leaf)};
  // A hook may add or remove hooks (itself included), so each step looks up the next one by id:
  // ids grow with every hook added, and the list keeps the order they were added in. A hook
  // removed before its turn does not run; one added meanwhile runs in this pass.
  const auto& hooks = leaf->grad_hooks->hooks;
  uint64_t last = 0;
  while (true) {
    const auto next = std::upper_bound(hooks.begin(), hooks.end(), last,
                                       [](uint64_t id, const auto& h) { return id < h.first; });
    if (next == hooks.end()) break;
    last = next->first;
    const autograd::GradHook hook = next->second;  // a copy: the hook may remove itself
    hook(t);
  }
}

// a + b into a fresh tensor (gradients from two consumers meeting at one value).
Tensor add_fresh(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  dispatch(Op::Add, {a, b}, {out});
  return out;
}

// Accumulates `g` into leaf.grad: steals `g` when nothing else refers to it, else copies or adds.
void accumulate_into_leaf(TensorImpl* leaf, Tensor g) {
  // A leaf whose requires_grad was turned off since the forward gets nothing (PyTorch's
  // AccumulateGrad skips it too), nor do its hooks run; a stand-in's, the leaf it redirects to.
  const GradHooks* hooks = leaf->grad_hooks.get();
  if (!(hooks && hooks->redirect ? hooks->redirect : leaf)->requires_grad) return;
  if (Tracer* tracer = current_tracer();
      tracer != nullptr && tracer->on_leaf_grad(Tensor(IntrusivePtr<TensorImpl>(leaf)), g)) {
    TracerScope quiet(nullptr);
    accumulate_into_leaf(leaf, std::move(g));
    return;
  }
  if (leaf->grad_hooks && leaf->grad_hooks->redirect) leaf = leaf->grad_hooks->redirect;
  if (!leaf->grad) {
    const bool unshared =
        g.impl()->use_count() == 1 && g.impl()->storage->use_count() == 1 && !g.impl()->grad_fn;
    if (!unshared) {
      Tensor copy = Tensor::empty(g.shape(), g.dtype(), g.device());
      dispatch(Op::Copy, {g}, {copy});
      g = std::move(copy);
    }
    leaf->grad = g.impl_ptr();
    if (Tracer* tracer = current_tracer())
      tracer->on_grad_set(Tensor(IntrusivePtr<TensorImpl>(leaf)), g);
  } else {
    const Tensor acc(leaf->grad);
    dispatch(Op::AddInplace, {acc, g}, {});
  }
  run_grad_hooks(leaf);
}

void check_grad(const Node& node, int i, const Tensor& g) {
  const TensorMeta& m = node.inputs[i];
  ENCORE_CHECK(g.shape() == m.shape && g.dtype() == m.dtype, "backward of ", node_name(node),
               ": gradient of input ", i, " is ", g.shape(), " ", g.dtype(), " but the input is ",
               m.shape, " ", m.dtype);
}

// Throws when `node` cannot run its backward: its saved tensors were released, or one of them
// was modified in place after the forward.
void check_runnable(const Node& node) {
  ENCORE_CHECK(!node.released, "backward: the saved tensors of ", node_name(node),
               " were released by an earlier backward; pass retain_graph=true to the first ",
               "backward to go through the graph twice");
  for (size_t s = 0; s < node.saved.size(); ++s) {
    const Tensor& t = node.saved[s];
    ENCORE_CHECK(t.version() == node.saved_versions[s], "backward of ", op_name(node.op),
                 ": a tensor ", t.shape(), " saved for backward was modified in place ",
                 "(version ", node.saved_versions[s], " -> ", t.version(), ")");
  }
}

// Checks every node reachable from `roots` (each once, stopping at leaves) before the pass
// delivers anything, so a graph that cannot run leaves every leaf's grad as it was.
void check_graph(std::span<const Tensor> roots) {
  const uint64_t walk = g_walks.fetch_add(1, std::memory_order_relaxed);
  absl::InlinedVector<Node*, 8> unvisited;  // inline: a one-node graph allocates nothing
  auto visit = [&](Node* n) {
    if (n == nullptr || n->checked_walk == walk) return;
    n->checked_walk = walk;
    unvisited.push_back(n);
  };
  for (const Tensor& root : roots) visit(root.grad_fn().get());
  while (!unvisited.empty()) {
    Node* n = unvisited.back();
    unvisited.pop_back();
    check_runnable(*n);
    for (const Edge& e : n->next) visit(e.node.get());
  }
}

struct SequenceLess {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr < b->sequence_nr; }
};

}  // namespace

Tensor filled(const TensorMeta& m, double value) {
  Tensor t = Tensor::empty(m.shape, m.dtype, m.device);
  dispatch(Op::Fill, {t}, {}, AttrBlob::of(ScalarAttrs{value}));
  return t;
}

Node::~Node() {
  // Saved tensors may hold the producers of this node's inputs (through their grad_fn); drop
  // them first so the edges below are the last owners.
  std::vector<IntrusivePtr<Node>> dying;
  auto take_sole_owned = [&dying](Node& n) {
    n.saved.clear();
    n.pending_grads.clear();
    n.payload.reset();
    // Each edge lets go of a producer others still own (which cannot free it here), and takes
    // the one it owns alone: so the last edge to a producer used twice (x * x) takes it, and a
    // producer also reached through a child (y = f(y) + y) is then that child's alone.
    for (Edge& e : n.next) {
      if (!e.node) continue;
      if (e.node->use_count() == 1)
        dying.push_back(std::move(e.node));
      else
        e.node.reset();
    }
  };
  take_sole_owned(*this);
  while (!dying.empty()) {
    IntrusivePtr<Node> n = std::move(dying.back());
    dying.pop_back();
    take_sole_owned(*n);
  }  // each n dies here with no sole-owned edges left, so its destructor goes no deeper
}

std::string_view node_name(const Node& node) {
  return node.label.empty() ? op_name(node.op) : node.label;
}

Edge gradient_edge(const Tensor& t) {
  Edge e;
  if (t.grad_fn()) {
    e.node = t.grad_fn();
    e.output_nr = t.impl()->output_nr;
  } else {
    e.leaf = t.impl_ptr();
  }
  return e;
}

void set_gradient_edge(TensorImpl& t, IntrusivePtr<Node> node, uint32_t output_nr) {
  t.requires_grad = true;
  t.grad_fn = std::move(node);
  t.output_nr = output_nr;
}

bool GradMode::enabled() {
  return t_grad_enabled;
}
void GradMode::set_enabled(bool on) {
  t_grad_enabled = on;
}

const Tensor& BackwardContext::input(int i) const {
  ENCORE_CHECK(i >= 0 && mask_bit(node_.save_inputs, static_cast<size_t>(i)), "backward of ",
               op_name(node_.op), ": input ", i, " was not saved");
  return node_.saved[std::popcount(static_cast<unsigned>(node_.save_inputs & ((1u << i) - 1)))];
}

const Tensor& BackwardContext::output(int i) const {
  ENCORE_CHECK(i >= 0 && mask_bit(node_.save_outputs, static_cast<size_t>(i)), "backward of ",
               op_name(node_.op), ": output ", i, " was not saved");
  return node_.saved[std::popcount(static_cast<unsigned>(node_.save_inputs)) +
                     std::popcount(static_cast<unsigned>(node_.save_outputs & ((1u << i) - 1)))];
}

namespace autograd {

uint64_t next_sequence_nr() {
  return g_sequence.fetch_add(1, std::memory_order_relaxed);
}

void record(Op op, const AttrBlob& attrs, const BackwardDef& def, std::span<const Tensor> inputs,
            std::span<Tensor> outputs) {
  bool any = false;
  for (const Tensor& t : inputs) any |= t.requires_grad();
  if (!any) return;

  auto node = make_intrusive<Node>();
  node->op = op;
  node->attrs = attrs;
  node->sequence_nr = g_sequence.fetch_add(1, std::memory_order_relaxed);
  node->backward = def.fn;
  // Bits of optional inputs the call left out are dropped: saved tensors are found by rank.
  uint8_t save = inputs.size() >= 8
                     ? def.save_inputs
                     : static_cast<uint8_t>(def.save_inputs & ((1u << inputs.size()) - 1));
  // An operand kept for the other operand's gradient only is dropped when that is not needed.
  for (size_t i = 0; i < 2 && i < inputs.size(); ++i)
    if (mask_bit(def.save_for_other, i) && !(inputs.size() > 1 && inputs[1 - i].requires_grad()))
      save = static_cast<uint8_t>(save & ~(1u << i));
  node->save_inputs = save;
  node->save_outputs = def.save_outputs;
  node->no_grad_outputs = def.no_grad_outputs;
  node->next.resize(inputs.size());
  node->inputs.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    node->inputs.push_back(TensorMeta::of(t));
    if (mask_bit(node->save_inputs, i)) {
      node->saved.push_back(t);
      node->saved_versions.push_back(t.version());
    }
    if (t.requires_grad()) node->next[i] = gradient_edge(t);
  }
  node->outputs.reserve(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    node->outputs.push_back(TensorMeta::of(outputs[i]));
    if (mask_bit(def.save_outputs, i)) {
      // A detached alias: saving the output itself would make the node own itself.
      node->saved.push_back(Tensor::view_of(outputs[i], outputs[i].shape()));
      node->saved_versions.push_back(outputs[i].version());
      if (Tracer* tracer = current_tracer()) tracer->on_saved_alias(outputs[i], node->saved.back());
    }
  }
  for (size_t i = 0; i < outputs.size(); ++i)
    if (!mask_bit(def.no_grad_outputs, i))
      set_gradient_edge(*outputs[i].impl(), node, static_cast<uint32_t>(i));
}

void backward(std::span<const Tensor> roots, std::span<const Tensor> grads, bool retain_graph) {
  ENCORE_CHECK(grads.empty() || grads.size() == roots.size(), "backward: ", roots.size(),
               " outputs but ", grads.size(), " gradients");
  profiler::ScopedSpan span("autograd backward", profiler::SpanKind::Backward);
  if (Tracer* tracer = current_tracer()) tracer->on_backward();
  // The outermost pass owns the callbacks; an aborted one drops them.
  struct PassScope {
    bool outermost = t_depth++ == 0;
    PassScope() {
      if (outermost) t_pass = g_passes.fetch_add(1, std::memory_order_relaxed);
    }
    ~PassScope() {
      if (--t_depth == 0) {
        t_pass = 0;
        t_callbacks.clear();
      }
    }
  } pass;
  NoGradGuard no_grad;
  // Inline storage: a static function's backward is one node, so a pass allocates nothing here.
  absl::InlinedVector<Node*, 8> heap;
  absl::InlinedVector<IntrusivePtr<Node>, 2> keep;  // roots' nodes stay alive for the pass

  auto deliver = [&](const Edge& e, Tensor g) {
    if (e.leaf) {
      accumulate_into_leaf(e.leaf.get(), std::move(g));
      return;
    }
    Node* n = e.node.get();
    if (n->pending_grads.empty()) n->pending_grads.resize(n->outputs.size());
    Tensor& slot = n->pending_grads[e.output_nr];
    slot = slot.defined() ? add_fresh(slot, g) : std::move(g);
    if (!n->enqueued) {
      n->enqueued = true;
      heap.push_back(n);
      std::push_heap(heap.begin(), heap.end(), SequenceLess());
    }
  };

  // Check every root before delivering anything, so a bad call leaves no node half-queued.
  for (size_t r = 0; r < roots.size(); ++r) {
    const Tensor& root = roots[r];
    ENCORE_CHECK(root.defined(), "backward: output ", r, " is an undefined tensor");
    ENCORE_CHECK(root.requires_grad(), "backward: output ", r, " ", root.shape(),
                 " does not require grad (no input of its computation requires grad)");
    if (grads.empty()) {
      ENCORE_CHECK(root.numel() == 1, "backward: a gradient can be created implicitly only for ",
                   "a one-element output; output ", r, " is ", root.shape(),
                   "; pass an explicit gradient");
    } else {
      const Tensor& g = grads[r];
      ENCORE_CHECK(g.defined() && g.shape() == root.shape() && g.dtype() == root.dtype() &&
                       g.device() == root.device(),
                   "backward: gradient ", r, " is ", g.str(), " but output ", r, " is ",
                   root.str());
    }
  }

  check_graph(roots);

  // On an error, leave no node marked as queued or holding gradients of the aborted pass.
  struct ResetOnError {
    absl::InlinedVector<Node*, 8>& heap;
    ~ResetOnError() {
      for (Node* n : heap) {
        n->enqueued = false;
        n->pending_grads.clear();
      }
    }
  } reset{heap};

  for (size_t r = 0; r < roots.size(); ++r) {
    const Tensor& root = roots[r];
    Tensor g = grads.empty() ? filled(TensorMeta::of(root), 1.0) : grads[r];
    Edge e = gradient_edge(root);
    if (e.node) keep.push_back(e.node);
    deliver(e, std::move(g));
  }

  absl::InlinedVector<Tensor, 4> grad_inputs;
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), SequenceLess());
    Node* node = heap.back();
    heap.pop_back();
    node->enqueued = false;
    absl::InlinedVector<Tensor, 1> grad_outputs = std::move(node->pending_grads);
    node->pending_grads.clear();

    // Checked again: a hook or a nested pass may have changed the node since check_graph.
    check_runnable(*node);
    for (size_t i = 0; i < grad_outputs.size(); ++i)
      if (!grad_outputs[i].defined() && node->materialize_grads &&
          !mask_bit(node->no_grad_outputs, i))
        grad_outputs[i] = filled(node->outputs[i], 0.0);

    grad_inputs.assign(node->inputs.size(), Tensor());
    BackwardContext ctx(*node, std::span<Tensor>(grad_outputs.data(), grad_outputs.size()),
                        std::span<Tensor>(grad_inputs.data(), grad_inputs.size()));
    node->backward(ctx);

    if (!retain_graph) {
      node->saved.clear();
      node->saved_versions.clear();
      node->released = node->save_inputs != 0 || node->save_outputs != 0 || node->payload;
      node->payload.reset();
    }
    for (size_t i = 0; i < node->next.size(); ++i) {
      const Edge& e = node->next[i];
      if (!e.active() || !grad_inputs[i].defined()) continue;
      check_grad(*node, static_cast<int>(i), grad_inputs[i]);
      deliver(e, std::move(grad_inputs[i]));
    }
  }
  if (pass.outermost)
    for (size_t i = 0; i < t_callbacks.size(); ++i) {
      const std::function<void()> fn = std::move(t_callbacks[i]);
      fn();
    }
}

uint64_t add_post_accumulate_grad_hook(const Tensor& leaf, GradHook hook) {
  ENCORE_CHECK(leaf.defined() && leaf.requires_grad() && leaf.is_leaf(),
               "add_post_accumulate_grad_hook: the tensor must be a leaf that requires grad; ",
               leaf.defined() ? leaf.str() : std::string("it is undefined"));
  ENCORE_CHECK(hook != nullptr, "add_post_accumulate_grad_hook: the hook is empty");
  TensorImpl& impl = *leaf.impl();
  if (!impl.grad_hooks) impl.grad_hooks = std::make_unique<GradHooks>();
  const uint64_t id = g_hook_ids.fetch_add(1, std::memory_order_relaxed);
  impl.grad_hooks->hooks.emplace_back(id, std::move(hook));
  g_hooks_epoch.fetch_add(1, std::memory_order_release);
  return id;
}

void remove_post_accumulate_grad_hook(const Tensor& leaf, uint64_t id) {
  if (!leaf.defined() || !leaf.impl()->grad_hooks) return;
  auto& hooks = leaf.impl()->grad_hooks->hooks;
  if (std::erase_if(hooks, [id](const auto& h) { return h.first == id; }) > 0)
    g_hooks_epoch.fetch_add(1, std::memory_order_release);
}

uint64_t hooks_epoch() {
  return g_hooks_epoch.load(std::memory_order_acquire);
}

uint64_t hooks_digest(const Tensor& leaf) {
  uint64_t d = 0;
  if (leaf.defined() && leaf.impl()->grad_hooks)
    for (const auto& [id, hook] : leaf.impl()->grad_hooks->hooks)
      d = (d ^ id) * 0x100000001b3ULL + 1;
  return d;
}

GradRedirect::GradRedirect(const Tensor& stand_in, const Tensor& leaf)
    : stand_in_(stand_in.impl()) {
  if (!stand_in_->grad_hooks) stand_in_->grad_hooks = std::make_unique<GradHooks>();
  stand_in_->grad_hooks->redirect = leaf.impl();
}

GradRedirect::~GradRedirect() {
  stand_in_->grad_hooks->redirect = nullptr;
}

void queue_callback(std::function<void()> fn) {
  ENCORE_CHECK(t_depth > 0, "autograd::queue_callback: no backward pass is running on this thread");
  t_callbacks.push_back(std::move(fn));
}

uint64_t current_pass() {
  return t_pass;
}

}  // namespace autograd
}  // namespace encore
