#include "encore/static_graph.h"

namespace encore {

bool set_static_enabled(bool on) {
  return schedule::set_enabled(on);
}
bool static_enabled() {
  return schedule::enabled();
}
bool set_static_fusion_enabled(bool on) {
  return schedule::set_fusion_enabled(on);
}
bool static_fusion_enabled() {
  return schedule::fusion_enabled();
}
bool set_static_early_updates_enabled(bool on) {
  return schedule::set_early_updates_enabled(on);
}
bool static_early_updates_enabled() {
  return schedule::early_updates_enabled();
}
bool set_static_lanes_enabled(bool on) {
  return schedule::set_lanes_enabled(on);
}
bool static_lanes_enabled() {
  return schedule::lanes_enabled();
}
bool set_static_padded_layouts_enabled(bool on) {
  return schedule::set_padded_layouts_enabled(on);
}
bool static_padded_layouts_enabled() {
  return schedule::padded_layouts_enabled();
}
bool set_static_fold_activations_enabled(bool on) {
  return schedule::set_fold_activations_enabled(on);
}
bool set_static_fold_constants_enabled(bool on) {
  return schedule::set_fold_constants_enabled(on);
}
bool static_fold_constants_enabled() {
  return schedule::fold_constants_enabled();
}
bool set_static_fold_layouts_enabled(bool on) {
  return schedule::set_fold_layouts_enabled(on);
}
bool static_fold_layouts_enabled() {
  return schedule::fold_layouts_enabled();
}
bool set_static_fold_cpu_updates_enabled(bool on) {
  return schedule::set_fold_cpu_updates_enabled(on);
}
bool static_fold_cpu_updates_enabled() {
  return schedule::fold_cpu_updates_enabled();
}
bool set_static_dynamic_enabled(bool on) {
  return schedule::set_dynamic_enabled(on);
}
bool static_dynamic_enabled() {
  return schedule::dynamic_enabled();
}
bool static_fold_activations_enabled() {
  return schedule::fold_activations_enabled();
}
bool set_static_redzones_enabled(bool on) {
  return schedule::set_redzones_enabled(on);
}
bool static_redzones_enabled() {
  return schedule::redzones_enabled();
}
std::vector<StaticStats> static_graph_report() {
  return schedule::report_all();
}
std::string static_graph_report_table() {
  return schedule::report_table();
}

namespace detail {

StaticCore::StaticCore(StaticOptions options, std::vector<nn::Module*> modules,
                       schedule::StaticGraph::Body body)
    : owned_(options.modules), modules_(std::move(modules)) {
  for (size_t i = 0; i < modules_.size(); ++i)
    ENCORE_CHECK(modules_[i] != nullptr, options.name, ": module ", i, " is null");
  ENCORE_CHECK(!options.name.empty(),
               "static_graph: name must not be empty (it names the function in messages)");
  ENCORE_CHECK(options.cache_limit >= 1, options.name, ": cache_limit must be at least 1, got ",
               options.cache_limit);
  ENCORE_CHECK(options.verify_every >= 0, options.name, ": verify_every must be >= 0, got ",
               options.verify_every);
  ENCORE_CHECK(options.size_limit >= 1, options.name, ": size_limit must be at least 1, got ",
               options.size_limit);
  ENCORE_CHECK(options.dynamic_dims.empty() || options.dynamic == DynamicShapes::Explicit,
               options.name, ": dynamic_dims names ", options.dynamic_dims.size(),
               options.dynamic_dims.size() == 1 ? " dimension" : " dimensions",
               "; they need dynamic = DynamicShapes::Explicit");
  for (const DynamicDim& d : options.dynamic_dims)
    ENCORE_CHECK(d.arg >= 0 && d.dim >= 0, options.name, ": dynamic_dims has {", d.arg, ", ", d.dim,
                 "}; arguments and dimensions count from 0");
  schedule::Config c;
  c.name = std::move(options.name);
  c.dynamic = options.dynamic;
  c.dynamic_dims = std::move(options.dynamic_dims);
  c.size_limit = options.size_limit;
  c.cache_limit = options.cache_limit;
  c.on_unsafe = options.on_unsafe;
  c.verify_every = options.verify_every;
  c.arg_names = std::move(options.arg_names);
  if (!modules_.empty()) {
    c.mode = [this] { return tree_mode(); };
    c.mode_text = [this](int64_t mode) { return mode_text(mode); };
    c.structure = [] { return nn::module_structure_epoch(); };
    c.tree = [this] {
      std::vector<const void*> tree;
      for (nn::Module* m : modules_)
        for (const nn::Module* d : m->modules()) tree.push_back(d);
      return tree;
    };
    // Buffers too: one replaced by another tensor (running statistics reset) is rebound, or
    // traced again when the trace wrote it in place.
    c.params = [this] {
      std::vector<schedule::ParamSlot> slots;
      for (size_t i = 0; i < modules_.size(); ++i)
        for (const bool buffers : {false, true})
          for (auto& [name, slot] :
               buffers ? modules_[i]->named_buffer_slots() : modules_[i]->named_parameter_slots())
            slots.push_back({modules_.size() == 1 ? name : cat("modules[", i, "].", name), slot});
      return slots;
    };
  }
  graph_ = std::make_unique<schedule::StaticGraph>(std::move(body), std::move(c));
}

namespace {

// Appends the train bit of `m` and its descendants, depth first, to a code of `bits` bits.
void mode_bits(const nn::Module& m, uint64_t& code, int& bits, int& train) {
  const bool on = m.is_training();
  train += on;
  // Exact up to 61 modules; beyond, an FNV-1a hash of the bits (with its top bit set).
  code = bits < 61 ? (code << 1) | static_cast<uint64_t>(on)
                   : (code ^ static_cast<uint64_t>(on)) * 1099511628211ULL;
  ++bits;
  for (const auto& [name, child] : m.named_children()) mode_bits(*child, code, bits, train);
}

}  // namespace

int64_t StaticCore::tree_mode() const {
  uint64_t code = 1;  // the leading 1 keeps the number of bits in the code
  int bits = 0, train = 0;
  for (const nn::Module* m : modules_) mode_bits(*m, code, bits, train);
  if (train == 0) return 0;
  if (train == bits) return 1;
  return 2 + static_cast<int64_t>(bits < 61 ? code : code | (uint64_t{1} << 62));
}

std::string StaticCore::mode_text(int64_t mode) const {
  // The modules in tree_mode's order, by path ("" for a root watched alone).
  std::vector<std::pair<std::string, const nn::Module*>> order;
  auto walk = [&order](auto&& self, const nn::Module& m, const std::string& path) -> void {
    order.emplace_back(path, &m);
    for (const auto& [name, child] : m.named_children())
      self(self, *child, path.empty() ? name : cat(path, ".", name));
  };
  for (size_t i = 0; i < modules_.size(); ++i)
    walk(walk, *modules_[i], modules_.size() == 1 ? std::string() : cat("modules[", i, "]"));
  const auto code = static_cast<uint64_t>(mode - 2);
  const size_t n = order.size();
  // A code of over 61 modules is a hash, and one of another tree than today's says nothing.
  if (n >= 61 || code >> n != 1) return "mixed train/eval";
  std::vector<std::string> in_train, in_eval;
  for (size_t i = 0; i < n; ++i) {
    const std::string what = order[i].second->describe();
    const std::string name = order[i].first.empty()
                                 ? what.substr(0, what.find('('))
                                 : cat(order[i].first, " (", what.substr(0, what.find('(')), ")");
    ((code >> (n - 1 - i)) & 1 ? in_train : in_eval).push_back(name);
  }
  const bool fewer_eval = in_eval.size() <= in_train.size();
  const std::vector<std::string>& named = fewer_eval ? in_eval : in_train;
  std::string list;
  for (size_t i = 0; i < named.size() && i < 4; ++i) list += cat(i ? ", " : "", named[i]);
  if (named.size() > 4) list += cat(" and ", named.size() - 4, " more");
  return cat(fewer_eval ? "train but " : "eval but ", list, fewer_eval ? " in eval" : " in train");
}

std::vector<Tensor> StaticCore::call(std::span<const Tensor> args, const std::string* key) {
  std::vector<Tensor> results;
  graph_->call(args, key, results);
  return results;
}

}  // namespace detail

namespace {
StaticOptions forward_options(StaticOptions o) {
  if (o.name == StaticOptions{}.name) o.name = "forward";
  return o;
}
}  // namespace

StaticForward::StaticForward(nn::Module* module, StaticOptions options,
                             schedule::StaticGraph::Body body)
    : module_(module), core_(forward_options(std::move(options)), {module}, std::move(body)) {
  module_->set_static_hook(this);
}

StaticForward::~StaticForward() {
  if (module_->static_hook() == this) module_->set_static_hook(nullptr);
}

Tensor StaticForward::call(const Tensor& x) {
  std::vector<Tensor> out = core_.call(std::span<const Tensor>(&x, 1), nullptr);
  ENCORE_CHECK(out.size() == 1, core_.graph().config().name, ": forward returned ", out.size(),
               " tensors");
  return std::move(out[0]);
}

namespace {
StaticForward& static_forward_of(const nn::Module& module) {
  auto* f = dynamic_cast<StaticForward*>(module.static_hook());
  ENCORE_CHECK(f != nullptr, module.describe(),
               ": this module has no static forward (ENCORE_STATIC_GRAPH in its class)");
  return *f;
}
}  // namespace

StaticStats static_stats(const nn::Module& module) {
  return static_forward_of(module).stats();
}

void static_clear(nn::Module& module) {
  static_forward_of(module).graph().clear();
}

std::string static_schedule_text(const nn::Module& module) {
  return static_forward_of(module).graph().schedule_text();
}

std::string static_schedule_dot(const nn::Module& module) {
  return static_forward_of(module).graph().schedule_dot();
}

}  // namespace encore
