// Shape families: built from traced recordings at several sizes, matched against a call's
// arguments, and instantiated for its sizes (see shape_family.h for the evidence they rest on).
#include "schedule/shape_family.h"

#include <algorithm>
#include <cmath>

#include "runtime/error.h"
#include "runtime/op_traits.h"

namespace encore::schedule::detail {

std::string step_label(const Recording& rec, int step) {
  const int nf = static_cast<int>(rec.forward.size());
  const Step& s = step < nf ? rec.forward[step] : rec.backward[step - nf];
  return step < nf ? cat("step ", step, " (forward) ", op_name(s.op))
                   : cat("step ", step - nf, " (backward) ", op_name(s.op));
}

namespace {

// Builds a family's expressions, step by step over all its points at once.
// Sets the attribute sizes of one step.
void set_attr(AttrBlob& a, const ShapeFamily::AttrSlot& slot, int64_t value) {
  switch (slot.field) {
    case kSliceStart: {
      SliceAttrs s = a.as<SliceAttrs>();
      s.start = value;
      a = AttrBlob::of(s);
      break;
    }
    case kSliceStop: {
      SliceAttrs s = a.as<SliceAttrs>();
      s.stop = value;
      a = AttrBlob::of(s);
      break;
    }
    case kBatchNormCount: {
      BatchNormAttrs s = a.as<BatchNormAttrs>();
      s.count = value;
      a = AttrBlob::of(s);
      break;
    }
    case kLayerNormCols: {
      LayerNormAttrs s = a.as<LayerNormAttrs>();
      s.cols = value;
      a = AttrBlob::of(s);
      break;
    }
    case kScalar: {
      const double v =
          slot.scalar_form == 0 ? static_cast<double>(value) : slot.k / static_cast<double>(value);
      a = AttrBlob::of(ScalarAttrs{v});
      break;
    }
    default:
      break;
  }
}

// Whether an instantiated step's operands still agree where its kernel assumes they do; the
// reason when not.
std::string check_step(const Step& s) {
  auto numel = [](const Operand& o) { return o.shape.numel(); };
  // `in` broadcasts to `out`: aligned from the right, each size equal or 1.
  auto broadcasts = [](const Shape& in, const Shape& out) {
    if (in.rank() > out.rank()) return false;
    for (int d = 1; d <= in.rank(); ++d)
      if (in[in.rank() - d] != out[out.rank() - d] && in[in.rank() - d] != 1) return false;
    return true;
  };
  // Ops whose inputs broadcast to their output (its shape was fitted to the traces' sizes: a
  // size where another input is the larger one must not be planned).
  const bool broadcasting =
      op_elementwise(s.op) || s.op == Op::Equal || s.op == Op::Greater || s.op == Op::Where;
  if (broadcasting && !s.out.empty()) {
    for (const Operand& in : s.in)
      if (numel(in) != numel(s.out[0]) && !broadcasts(in.shape, s.out[0].shape))
        return cat(op_name(s.op), " reads ", in.shape, " for ", s.out[0].shape);
  }
  if ((s.op == Op::AddInplace || s.op == Op::CopyInplace) && numel(s.in[1]) != numel(s.in[0]) &&
      !broadcasts(s.in[1].shape, s.in[0].shape))
    return cat(op_name(s.op), " adds ", s.in[1].shape, " into ", s.in[0].shape);
  if (s.op == Op::Matmul && s.in[0].shape.rank() >= 2 && s.in[1].shape.rank() >= 2) {
    const MatmulAttrs& m = s.attrs.as<MatmulAttrs>();
    const Shape &a = s.in[0].shape, &b = s.in[1].shape;
    const int64_t ka = m.trans_a ? a[a.rank() - 2] : a[a.rank() - 1];
    const int64_t kb = m.trans_b ? b[b.rank() - 1] : b[b.rank() - 2];
    if (ka != kb) return cat("matmul of ", a, " and ", b);
    // The batch dimensions broadcast to the output's.
    const Shape& y = s.out[0].shape;
    auto batch = [](const Shape& t) {
      Shape out;
      for (int d = 0; d + 2 < t.rank(); ++d) out.push_back(t[d]);
      return out;
    };
    if (!broadcasts(batch(a), batch(y)) || !broadcasts(batch(b), batch(y)))
      return cat("matmul of ", a, " and ", b, " into ", y);
  }
  if (s.op == Op::Linear && s.in[0].shape.rank() >= 1 && s.in[1].shape.rank() == 2 &&
      s.in[0].shape[s.in[0].shape.rank() - 1] != s.in[1].shape[1])
    return cat("linear of ", s.in[0].shape, " and ", s.in[1].shape);
  // Operands whose sizes the kernel takes to agree, as the routine checked them eagerly: each
  // came from its own producer, so sizes equal at the traces may differ here.
  switch (s.op) {
    case Op::Conv2d:
    case Op::MaxPool2d:
    case Op::AvgPool2d: {
      // A kernel larger than the padded input gives no output (at stride 1 the size rule's
      // floor division cannot tell), and an empty image none either.
      const Shape &x = s.in[0].shape, &y = s.out[0].shape;
      if (y.rank() == 4 && (y[2] < 1 || y[3] < 1 || x[2] < 1 || x[3] < 1))
        return cat(op_name(s.op), " of ", x, " would give ", y);
      if (s.op != Op::Conv2d) break;
      // The input's channels are the weight's times the groups; the bias has one per output.
      const Shape& w = s.in[1].shape;
      if (x.rank() == 4 && w.rank() == 4 && x[1] != w[1] * s.attrs.as<Conv2dAttrs>().groups)
        return cat(op_name(s.op), " of ", x, " and weight ", w);
      if (s.in.size() > 2 && w.rank() == 4 && numel(s.in[2]) != w[0])
        return cat(op_name(s.op), " of weight ", w, " and bias ", s.in[2].shape);
      break;
    }
    case Op::Linear:
      if (s.in.size() > 2 && s.in[1].shape.rank() == 2 && numel(s.in[2]) != s.in[1].shape[0])
        return cat(op_name(s.op), " of weight ", s.in[1].shape, " and bias ", s.in[2].shape);
      break;
    case Op::BatchNorm:
    case Op::BatchNormInference:
      // Training statistics need two values per channel (the routine refuses one).
      if (s.op == Op::BatchNorm && s.in[0].shape.rank() >= 2 && numel(s.in[0]) <= s.in[0].shape[1])
        return cat(op_name(s.op), " of ", s.in[0].shape, " has one value per channel");
      // Every per-channel vector has one value per channel of x.
      for (size_t k = 1; k < s.in.size(); ++k)
        if (s.in[0].shape.rank() >= 2 && numel(s.in[k]) != s.in[0].shape[1])
          return cat(op_name(s.op), " of ", s.in[0].shape, " and ", s.in[k].shape);
      break;
    case Op::SoftmaxCrossEntropy:
    case Op::SoftmaxCrossEntropyGrad:
    case Op::Accuracy:
      if (s.in[0].shape.rank() == 2 && numel(s.in[1]) != s.in[0].shape[0])
        return cat(op_name(s.op), " of logits ", s.in[0].shape, " and labels ", s.in[1].shape);
      break;
    case Op::MeanSquaredError:
      if (!(s.in[0].shape == s.in[1].shape))
        return cat(op_name(s.op), " of ", s.in[0].shape, " and ", s.in[1].shape);
      break;
    case Op::SoftmaxGrad:
    case Op::LogSoftmaxGrad:
      if (!(s.in[0].shape == s.in[1].shape))
        return cat(op_name(s.op), " of ", s.in[0].shape, " and ", s.in[1].shape);
      break;
    case Op::Concat:
    case Op::Split: {
      // The pieces agree with the whole but along the axis, and add up to it there.
      const Operand& whole = s.op == Op::Concat ? s.out[0] : s.in[0];
      const auto pieces =
          s.op == Op::Concat ? std::span<const Operand>(s.in) : std::span<const Operand>(s.out);
      const int axis = s.attrs.as<AxisAttrs>().axis;
      int64_t along = 0;
      for (const Operand& p : pieces) {
        if (p.shape.rank() != whole.shape.rank() || axis < 0 || axis >= p.shape.rank())
          return cat(op_name(s.op), " of ", p.shape, " and ", whole.shape);
        for (int d = 0; d < p.shape.rank(); ++d)
          if (d != axis && p.shape[d] != whole.shape[d])
            return cat(op_name(s.op), " of ", p.shape, " and ", whole.shape, " along axis ", axis);
        along += p.shape[axis];
      }
      if (along != whole.shape[axis])
        return cat(op_name(s.op), " of pieces adding up to ", along, " for ", whole.shape);
      break;
    }
    default:
      break;
  }
  return {};
}

}  // namespace

FamilyBuild build_family(std::vector<FamilyPoint> points, std::vector<DynDim> dims) {
  FamilyBuild out;
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  ENCORE_CHECK(points.size() >= 2 && points.size() <= kMaxFamilyPoints && !dims.empty(),
               "build_family: needs 2 to ", kMaxFamilyPoints, " points and a dimension");
  for (size_t p = 1; p < points.size(); ++p)
    if (std::string d = structure_diff(*points[0].rec, *points[p].rec); !d.empty()) {
      out.why = d;
      out.structure_differs = true;
      return out;
    }
  auto f = std::make_unique<ShapeFamily>();
  f->dims = dims;
  // Dimensions with the same value at every point share a symbol.
  std::vector<std::vector<int64_t>> values(dims.size());
  for (size_t k = 0; k < dims.size(); ++k)
    for (const FamilyPoint& p : points) {
      ENCORE_CHECK(dims[k].arg < static_cast<int>(p.sig.args.size()) &&
                       dims[k].dim < p.sig.args[dims[k].arg].shape.rank(),
                   "build_family: no dimension ", dims[k].dim, " of argument ", dims[k].arg);
      values[k].push_back(p.sig.args[dims[k].arg].shape[dims[k].dim]);
    }
  std::vector<std::vector<int64_t>> symbol_values;  // per symbol, its values at the points
  for (size_t k = 0; k < dims.size(); ++k) {
    auto it = std::find(symbol_values.begin(), symbol_values.end(), values[k]);
    f->symbol_of.push_back(static_cast<int>(it - symbol_values.begin()));
    if (it == symbol_values.end()) symbol_values.push_back(values[k]);
  }
  f->symbols = static_cast<int>(symbol_values.size());
  std::vector<std::vector<int64_t>> at_points(points.size(), std::vector<int64_t>(f->symbols));
  for (size_t p = 0; p < points.size(); ++p)
    for (int s = 0; s < f->symbols; ++s) at_points[p][s] = symbol_values[s][p];
  f->pool = ExprPool(std::move(at_points));
  f->sig = points.back().sig;
  f->points = std::move(points);

  for (const std::vector<int64_t>& v : symbol_values)
    f->serves_one.push_back(std::count(v.begin(), v.end(), 1) > 0);
  if (!derive_sizes(*f, out.why)) {
    out.clamps_differ = f->clamps_differ;
    return out;
  }

  for (ExprId e : f->dim_exprs) {
    const std::span<const int64_t> at = f->pool.values(e);
    f->one_at_trace.push_back(std::find(at.begin(), at.end(), 1) != at.end());
  }
  std::vector<ExprId*> roots;
  for (ExprId& e : f->dim_exprs) roots.push_back(&e);
  for (ShapeFamily::AttrSlot& a : f->attrs) roots.push_back(&a.e);
  for (ShapeFamily::Guard& g : f->guards) {
    roots.push_back(&g.taken);
    roots.push_back(&g.other);
  }
  for (ShapeFamily::Range& r : f->ranges) roots.push_back(&r.n);
  f->pool = f->pool.compact(roots);
  // The recording instantiated is the latest trace's: its constants and bound tensors are the
  // ones a replay at that size would use.
  f->base = f->points.back().rec;
  out.family = std::move(f);
  return out;
}

bool family_sizes(const ShapeFamily& f, std::span<const Tensor> args, const std::string* key,
                  bool grad, int64_t mode, std::vector<int64_t>& symbols) {
  const Signature& s = f.sig;
  if (s.args.size() != args.size() || s.grad != grad || s.mode != mode) return false;
  if ((key == nullptr ? !s.key.empty() : s.key != *key)) return false;
  symbols.assign(static_cast<size_t>(f.symbols), -1);
  size_t next = 0;  // f.dims is sorted by argument, then dimension
  for (size_t i = 0; i < args.size(); ++i) {
    const ArgSig& a = s.args[i];
    if (args[i].defined() != a.defined) return false;
    if (!a.defined) continue;
    const TensorImpl& t = *args[i].impl();
    if (t.dtype != a.dtype || t.requires_grad != a.requires_grad ||
        t.shape.rank() != a.shape.rank() || t.storage->device() != a.device)
      return false;
    for (int d = 0; d < a.shape.rank(); ++d) {
      if (next < f.dims.size() && f.dims[next].arg == static_cast<int>(i) &&
          f.dims[next].dim == d) {
        const int sym = f.symbol_of[next++];
        int64_t& v = symbols[static_cast<size_t>(sym)];
        if (t.shape[d] < 1 || (t.shape[d] == 1 && !f.serves_one[static_cast<size_t>(sym)]) ||
            (v >= 0 && v != t.shape[d]))
          return false;
        v = t.shape[d];
      } else if (t.shape[d] != a.shape[d]) {
        return false;
      }
    }
  }
  return same_aliasing(s, args);
}

std::string range_text(const ShapeFamily& f, const ShapeFamily::Range& r) {
  return cat(r.what, " keeps ", f.pool.text(r.n), " within ", r.lo, " to ", r.hi,
             r.step > 0 ? cat(" in steps of ", r.step) : std::string());
}

std::shared_ptr<Recording> instantiate(const ShapeFamily& f, std::span<const int64_t> symbols,
                                       std::string& why, bool anywhere) {
  std::vector<int64_t> v;
  if (!f.pool.eval(symbols, v)) {
    why = cat("no schedule at ", sizes_text(symbols),
              ": a size would be negative or overflow (a kernel larger than its padded input?)");
    return nullptr;
  }
  for (const ShapeFamily::Guard& g : f.guards) {
    const int64_t a = v[static_cast<size_t>(g.taken)], b = v[static_cast<size_t>(g.other)];
    if (g.at_most && a > b) {
      why = cat("no schedule at ", sizes_text(symbols), ": ", g.what, " (", f.pool.text(g.taken),
                " = ", a, ") would pass ", f.pool.text(g.other), " = ", b,
                ", which it did not at the traced sizes");
      return nullptr;
    }
    if (!g.at_most && a != b) {
      why = cat("no schedule at ", sizes_text(symbols), ": the traced sizes did not tell whether ",
                g.what, " is ", f.pool.text(g.taken), " or ", f.pool.text(g.other),
                ", which differ here");
      return nullptr;
    }
  }
  for (const ShapeFamily::Range& r : f.ranges) {
    const int64_t n = v[static_cast<size_t>(r.n)];
    if (anywhere || (n >= r.lo && n <= r.hi && (r.step == 0 || (n - r.lo) % r.step == 0))) continue;
    why = cat("no schedule at ", sizes_text(symbols), ": ", r.what,
              " may be computed from the size it slices, which would be ", n, " here and was ",
              r.lo, " to ", r.hi, r.step > 0 ? cat(" in steps of ", r.step) : std::string(),
              " at the traced sizes");
    return nullptr;
  }
  auto rec = std::make_shared<Recording>(*f.base);
  size_t k = 0;
  bool ok = true;
  ExprId becomes_one = -1;
  for_each_operand(*rec, [&](Operand& o) {
    Shape s;
    for (int d = 0; d < o.shape.rank(); ++d) {
      const ExprId e = f.dim_exprs[k++];
      const int64_t x = v[static_cast<size_t>(e)];
      if (x < 0 || !ok || becomes_one >= 0) {
        ok = false;
        continue;
      }
      // A size that is 1 here and was not at any trace: an op may take another path at 1 (a sum
      // over one element is a copy, a broadcast from 1 none), as eager would; traced.
      if (x == 1 && !f.one_at_trace[k - 1]) {
        becomes_one = e;
        continue;
      }
      try {
        s.push_back(x);
      } catch (const Error&) {
        ok = false;
      }
    }
    if (ok) o.shape = s;
  });
  if (becomes_one >= 0) {
    why = cat("no schedule at ", sizes_text(symbols), ": a size of the schedule, ",
              f.pool.text(becomes_one),
              ", would be 1, which it was not at the traced sizes (an op "
              "may take another path at 1)");
    return nullptr;
  }
  if (!ok) {
    why = cat("no schedule at ", sizes_text(symbols), ": a shape would be negative or too large");
    return nullptr;
  }
  const int nf = static_cast<int>(rec->forward.size());
  for (const ShapeFamily::AttrSlot& a : f.attrs) {
    Step& s = a.step < nf ? rec->forward[a.step] : rec->backward[a.step - nf];
    set_attr(s.attrs, a, v[static_cast<size_t>(a.e)]);
  }
  // Temporaries, arguments and incoming gradients hold what their largest operand needs.
  std::vector<size_t> largest(rec->buffers.size(), 0);
  for_each_operand(
      *rec, [&](const Operand& o) { largest[o.buf] = std::max(largest[o.buf], o.nbytes()); });
  for (size_t b = 0; b < rec->buffers.size(); ++b) {
    Buffer& buf = rec->buffers[b];
    // A constant's value is the traced size's (an attribute from a size, such as a slice's
    // start, may change it where its shape stays): a planned size runs the steps computing it.
    buf.constant = false;
    buf.trace_value = Tensor();
    if (buf.kind == BufKind::Temp || buf.kind == BufKind::Arg || buf.kind == BufKind::GradIn)
      buf.nbytes = largest[b];
    else if (largest[b] > buf.nbytes) {
      why = cat("no schedule at ", sizes_text(symbols), ": buffer ", b,
                " would be read past its end");
      return nullptr;
    }
  }
  for (const std::vector<Step>* steps : {&rec->forward, &rec->backward})
    for (const Step& s : *steps)
      if (std::string bad = check_step(s); !bad.empty()) {
        why = cat("no schedule at ", sizes_text(symbols), ": ", bad);
        return nullptr;
      }
  return rec;
}

std::vector<std::vector<std::string>> symbol_names(const ShapeFamily& f) {
  std::vector<std::vector<std::string>> out(f.sig.args.size());
  for (size_t i = 0; i < out.size(); ++i)
    out[i].assign(static_cast<size_t>(f.sig.args[i].shape.rank()), std::string());
  for (size_t k = 0; k < f.dims.size(); ++k)
    out[f.dims[k].arg][f.dims[k].dim] = cat("s", f.symbol_of[k]);
  return out;
}

std::string sizes_text(std::span<const int64_t> symbols) {
  std::string s;
  for (size_t k = 0; k < symbols.size(); ++k) s += cat(k ? ", " : "", "s", k, "=", symbols[k]);
  return s;
}

}  // namespace encore::schedule::detail
