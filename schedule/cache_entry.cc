// A cache entry's guards and its profiler span names.
#include "schedule/cache_entry.h"

namespace encore::schedule::detail {
namespace {

std::string_view span_name(std::string_view name, int64_t id, profiler::SpanKind kind) {
  static constexpr const char* kWhat[] = {"forward replay", "backward replay", "trace",
                                          "trace backward"};
  return intern(cat(name, " [entry ", id, "] ", kWhat[static_cast<int>(kind)]));
}

std::string leaf_label(const Entry& e, const Leaf& l) {
  return l.param >= 0 ? cat("parameter '", e.slots[l.param].name, "'")
                      : cat("captured tensor ", l.tensor.shape());
}

}  // namespace

std::string_view span_name(Entry& e, profiler::SpanKind kind) {
  std::call_once(e.span_names_once, [&e] {
    for (int k = 0; k < 4; ++k)
      e.span_names[k] = span_name(e.name, e.id, static_cast<profiler::SpanKind>(k));
  });
  return e.span_names[static_cast<int>(kind)];
}

std::string guard_failure(const Entry& e) {
  if (e.eager_only) return {};  // runs the function itself
  for (const ParamGuard& g : e.params) {
    const Tensor& p = *e.slots[g.slot].slot;
    const std::string& name = e.slots[g.slot].name;
    if (!p.defined()) return cat("parameter '", name, "' is now undefined");
    if (!(p.shape() == g.shape))
      return cat("parameter '", name, "' shape changed ", g.shape, " -> ", p.shape());
    if (p.dtype() != g.dtype)
      return cat("parameter '", name, "' dtype changed ", g.dtype, " -> ", p.dtype());
    if (p.device() != g.device)
      return cat("parameter '", name, "' device changed ", g.device, " -> ", p.device());
    if (p.requires_grad() != g.requires_grad)
      return cat("parameter '", name, "' requires_grad changed ",
                 g.requires_grad ? "true -> false" : "false -> true");
  }
  for (const GradGuard& g : e.grads) {
    const Leaf& l = e.rec->leaves[g.leaf];
    const Tensor& t = leaf_now(e, l);
    const Tensor grad = t.defined() ? t.grad() : Tensor();
    if (grad.defined() != g.defined)
      return cat("gradient of ", leaf_label(e, l), " changed ", g.defined ? "defined" : "undefined",
                 " -> ", grad.defined() ? "defined" : "undefined");
    if (g.defined && !(grad.shape() == g.shape))
      return cat("gradient of ", leaf_label(e, l), " shape changed ", g.shape, " -> ",
                 grad.shape());
  }
  return {};
}

}  // namespace encore::schedule::detail
