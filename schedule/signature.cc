// Signatures: taken from a call's arguments, matched against an entry's, described and
// compared for the retrace reasons.
#include "schedule/signature.h"

#include <algorithm>

#include "runtime/autograd.h"

namespace encore::schedule::detail {
namespace {

int64_t byte_offset(const TensorImpl& t) {
  return t.offset * static_cast<int64_t>(itemsize(t.dtype));
}

// The aliasing fields of argument i's ArgSig (an undefined tensor aliases nothing).
void alias_of(std::span<const Tensor> args, size_t i, ArgSig& a) {
  a.same_as = a.shares_with = -1;
  a.shared_offset = 0;
  if (!args[i].defined()) return;
  const TensorImpl& t = *args[i].impl();
  for (size_t j = 0; j < i; ++j) {
    if (!args[j].defined()) continue;
    const TensorImpl& u = *args[j].impl();
    if (a.same_as < 0 && &u == &t) a.same_as = static_cast<int>(j);
    if (a.shares_with < 0 && u.storage == t.storage) {
      a.shares_with = static_cast<int>(j);
      a.shared_offset = byte_offset(t) - byte_offset(u);
    }
  }
}

// " (same tensor as argument 0)", " (shares storage with argument 0 at byte offset 16)", "".
std::string alias_text(const ArgSig& a) {
  if (a.same_as >= 0) return cat(" (same tensor as argument ", a.same_as, ")");
  if (a.shares_with < 0) return {};
  return cat(" (shares storage with argument ", a.shares_with,
             a.shared_offset == 0 ? std::string() : cat(" at byte offset ", a.shared_offset), ")");
}

std::string mode_name(int64_t mode, const Config& c) {
  if (mode < 0) return "no module";
  if (mode == 0) return "eval";
  if (mode == 1) return "train";
  return c.mode_text ? c.mode_text(mode) : "mixed train/eval";
}

}  // namespace

Signature signature_of(std::span<const Tensor> args, const std::string* key, int64_t mode) {
  Signature s;
  s.args.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const Tensor& t = args[i];
    if (!t.defined()) {
      s.args.emplace_back(ArgSig{Shape(), DType::Float32, Device::cpu(), false}).defined = false;
      continue;
    }
    ArgSig& a = s.args.emplace_back(ArgSig{t.shape(), t.dtype(), t.device(), t.requires_grad()});
    alias_of(args, i, a);
  }
  s.grad = GradMode::enabled();
  s.mode = mode;
  if (key != nullptr) s.key = *key;
  return s;
}

bool matches(const Signature& s, std::span<const Tensor> args, const std::string* key, bool grad,
             int64_t mode) {
  if (s.args.size() != args.size() || s.grad != grad || s.mode != mode) return false;
  if ((key == nullptr ? !s.key.empty() : s.key != *key)) return false;
  for (size_t i = 0; i < args.size(); ++i) {
    const ArgSig& a = s.args[i];
    if (args[i].defined() != a.defined) return false;
    if (!a.defined) continue;
    const TensorImpl& t = *args[i].impl();
    if (t.dtype != a.dtype || t.requires_grad != a.requires_grad || !(t.shape == a.shape) ||
        t.storage->device() != a.device)
      return false;
  }
  return same_aliasing(s, args);
}

bool same_aliasing(const Signature& s, std::span<const Tensor> args) {
  for (size_t i = 1; i < args.size(); ++i) {
    ArgSig now;
    alias_of(args, i, now);
    const ArgSig& a = s.args[i];
    if (now.same_as != a.same_as || now.shares_with != a.shares_with ||
        now.shared_offset != a.shared_offset)
      return false;
  }
  return true;
}

std::string arg_label(const Config& c, size_t i) {
  return i < c.arg_names.size() && !c.arg_names[i].empty()
             ? cat("argument ", i, " '", c.arg_names[i], "'")
             : cat("argument ", i);
}

std::string describe(const Signature& s, const Config& c) {
  return describe(s, c, {});
}

std::string describe(const Signature& s, const Config& c,
                     const std::vector<std::vector<std::string>>& dims) {
  std::string out;
  for (size_t i = 0; i < s.args.size(); ++i) {
    const ArgSig& a = s.args[i];
    const std::string name =
        i < c.arg_names.size() && !c.arg_names[i].empty() ? c.arg_names[i] : cat("arg", i);
    if (!a.defined) {
      out += cat(i ? ", " : "", name, ": undefined");
      continue;
    }
    std::string shape = a.shape.str();
    if (i < dims.size()) {
      std::string inner;
      for (int d = 0; d < a.shape.rank(); ++d)
        inner += cat(d ? "," : "", static_cast<size_t>(d) < dims[i].size() && !dims[i][d].empty()
                                       ? dims[i][d]
                                       : cat(a.shape[d]));
      shape = cat("[", inner, "]");
    }
    out += cat(i ? ", " : "", name, ": ", a.dtype, shape,
               a.device == Device::cpu() ? "" : cat(" ", a.device),
               a.requires_grad ? " requires_grad" : "", alias_text(a));
  }
  return cat(out, "; grad ", s.grad ? "on" : "off", s.mode < 0 ? "" : "; " + mode_name(s.mode, c),
             s.key.empty() ? "" : cat("; key '", s.key, "'"));
}

std::vector<Change> diff(const Signature& old, const Signature& now, const Config& c) {
  std::vector<Change> out;
  if (old.args.size() != now.args.size())
    out.push_back({"the number of arguments",
                   cat("number of arguments changed ", old.args.size(), " -> ", now.args.size())});
  for (size_t i = 0; i < std::min(old.args.size(), now.args.size()); ++i) {
    const ArgSig &a = old.args[i], &b = now.args[i];
    const std::string arg = arg_label(c, i);
    if (a.defined != b.defined) {
      auto text = [](const ArgSig& x) {
        return x.defined ? cat(x.dtype, x.shape) : std::string("undefined");
      };
      out.push_back({arg, cat(arg, " changed ", text(a), " -> ", text(b))});
      continue;
    }
    if (!a.defined) continue;
    if (a.dtype != b.dtype)
      out.push_back({arg + " dtype", cat(arg, " dtype changed ", a.dtype, " -> ", b.dtype)});
    if (a.device != b.device)
      out.push_back({arg + " device", cat(arg, " device changed ", a.device, " -> ", b.device)});
    if (a.shape.rank() != b.shape.rank()) {
      out.push_back({arg + " rank", cat(arg, " shape changed ", a.shape, " -> ", b.shape)});
    } else {
      for (int d = 0; d < a.shape.rank(); ++d)
        if (a.shape[d] != b.shape[d])
          out.push_back({cat(arg, " dim ", d),
                         cat(arg, " dim ", d, " changed ", a.shape[d], " -> ", b.shape[d]),
                         b.shape[d], static_cast<int>(i), d});
    }
    if (a.requires_grad != b.requires_grad)
      out.push_back({arg + " requires_grad",
                     cat(arg, " requires_grad changed ", a.requires_grad ? "true" : "false", " -> ",
                         b.requires_grad ? "true" : "false")});
    if (alias_text(a) != alias_text(b)) {
      const std::string was = alias_text(a), now = alias_text(b);
      out.push_back(
          {arg + " aliasing", cat(arg, " aliasing changed", was.empty() ? " (no alias)" : was,
                                  " ->", now.empty() ? " (no alias)" : now)});
    }
  }
  if (old.grad != now.grad)
    out.push_back({"grad mode", cat("grad mode changed ", old.grad ? "on" : "off", " -> ",
                                    now.grad ? "on" : "off")});
  if (old.mode != now.mode)
    out.push_back(
        {"mode", cat("mode changed ", mode_name(old.mode, c), " -> ", mode_name(now.mode, c))});
  if (old.key != now.key)
    out.push_back({"key", cat("key changed '", old.key, "' -> '", now.key, "'")});
  return out;
}

}  // namespace encore::schedule::detail
