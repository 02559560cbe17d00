// Layout folds (every device, with fusion on): a value that a layout step (permute, slice, split,
// copy) writes and that only other layout steps read is not written at all; its readers read its
// elements where it read them. A chain of layout steps becomes one StridedCopy step
// (runtime/strided_copy.h): the head split of attention, a split of q, k and v followed by a
// permute of each, is three copies from the projection, in one step, instead of four steps; the
// gradient's three permutes and the concat of their results are one copy into the concat's output.
// Each value is a view of the buffer the chain starts from (an offset and strides), so a fold moves
// the same elements to the same places and the bits are eager's.
//
// A folded value's readers must all be layout steps of its phase, nothing may write the chain's
// first buffer between its first reader and the step that now reads it in its place, and each
// reader's shape must split the view's dimensions (a reshape of a view, as a view of a view in
// PyTorch). A value some reader cannot take keeps its step.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "schedule/rewriter.h"

namespace encore::schedule {
namespace {

bool is_layout(Op op) {
  return op == Op::Permute || op == Op::Slice || op == Op::Split || op == Op::Concat ||
         op == Op::Copy;
}

struct Dim {
  int64_t size = 1, stride = 0;
};

// A value as a view of the buffer its chain starts from: its elements, in row-major order, are
// root[offset + sum(i_d * dims[d].stride)].
struct View {
  Operand root;          // the buffer, as the chain's first step read it
  int root_reader = -1;  // that step
  int64_t offset = 0;
  std::vector<Dim> dims;
  std::vector<int> through;  // the steps whose values it stands for, in order
};

// `v`'s dimensions, those walked contiguously merged, split so that each axis of `shape` is a
// run of them (its axis in `axis`), or nothing where the two have no common refinement (the
// transpose of a [4, 6] value read as [6, 4]).
struct Refined {
  std::vector<Dim> dims;
  std::vector<int> axis;
};
std::optional<Refined> refine(const View& v, const Shape& shape) {
  std::vector<Dim> merged;
  for (const Dim& d : v.dims) {
    if (d.size == 1) continue;
    if (!merged.empty() && merged.back().stride == d.stride * d.size) {
      merged.back() = {merged.back().size * d.size, d.stride};
    } else {
      merged.push_back(d);
    }
  }
  Refined r;
  int i = static_cast<int>(merged.size()) - 1;
  Dim a;  // what is left of merged[i]
  auto next = [&] {
    if (i >= 0) a = merged[i];
  };
  next();
  for (int j = shape.rank() - 1; j >= 0; --j) {
    int64_t need = shape[j];
    if (need == 0) return std::nullopt;
    if (need == 1) {
      r.dims.push_back({1, 0});
      r.axis.push_back(j);
    }
    while (need > 1) {
      if (i < 0 || a.size == 0) return std::nullopt;
      if (a.size > need) {  // the inner part of a
        if (a.size % need != 0) return std::nullopt;
        r.dims.push_back({need, a.stride});
        a = {a.size / need, a.stride * need};
        need = 1;
      } else {
        if (need % a.size != 0) return std::nullopt;
        r.dims.push_back(a);
        need /= a.size;
        --i;
        next();
      }
      r.axis.push_back(j);
    }
  }
  if (i >= 0) return std::nullopt;
  std::reverse(r.dims.begin(), r.dims.end());
  std::reverse(r.axis.begin(), r.axis.end());
  return r;
}

// Elements [start, start + count * step) of `axis`, every step-th: the axis' run of dimensions
// narrowed, or false where that run cannot hold it (a step across two dimensions).
bool narrow(Refined& r, int64_t& offset, int axis, int64_t start, int64_t count, int64_t step) {
  const auto first = std::find(r.axis.begin(), r.axis.end(), axis) - r.axis.begin();
  const auto last = std::find(r.axis.rbegin(), r.axis.rend(), axis).base() - r.axis.begin();
  Dim& d = r.dims[first];
  if (last - first == 1) {
    offset += start * d.stride;
    d = {count, count > 1 ? d.stride * step : 0};
    return true;
  }
  int64_t inner = 1;
  for (auto k = first + 1; k < last; ++k) inner *= r.dims[k].size;
  if (step != 1 || start % inner != 0 || count % inner != 0) return false;
  offset += start / inner * d.stride;
  d.size = count / inner;
  return true;
}

// Where `s` (a layout step) puts each value it reads: per output, the view it writes when its
// inputs are the views `in` (Permute, Slice, Split, Copy); or, for a Concat, per input the
// output strides of its refined dimensions and its offset in the output.
struct Moved {
  std::vector<std::optional<View>> out;           // per output; empty for a Concat
  std::vector<std::vector<int64_t>> out_strides;  // per input of a Concat
  std::vector<int64_t> out_offset;                // per input of a Concat
  std::vector<Refined> in;                        // per input, refined to its shape
};

std::optional<Moved> move_through(const Step& s, const std::vector<View>& in) {
  Moved m;
  for (size_t k = 0; k < s.in.size(); ++k) {
    std::optional<Refined> r = refine(in[k], s.in[k].shape);
    if (!r) return std::nullopt;
    m.in.push_back(std::move(*r));
  }
  auto output = [&](const Refined& r, int64_t offset) {
    View v{in[0].root, in[0].root_reader, offset, r.dims, in[0].through};
    return v;
  };
  const Refined& r = m.in[0];
  switch (s.op) {
    case Op::Copy:
      m.out.push_back(output(r, in[0].offset));
      return m;
    case Op::Permute: {
      const PermuteAttrs& a = s.attrs.as<PermuteAttrs>();
      Refined p;
      for (int d = 0; d < s.out[0].shape.rank(); ++d)
        for (size_t k = 0; k < r.dims.size(); ++k)
          if (r.axis[k] == a.perm[d]) p.dims.push_back(r.dims[k]);
      m.out.push_back(output(p, in[0].offset));
      return m;
    }
    case Op::Slice: {
      const SliceAttrs& a = s.attrs.as<SliceAttrs>();
      Refined n = r;
      int64_t offset = in[0].offset;
      const int axis = static_cast<int>(a.axis);
      if (!narrow(n, offset, axis, a.start, s.out[0].shape[axis], a.step)) return std::nullopt;
      m.out.push_back(output(n, offset));
      return m;
    }
    case Op::Split: {
      const int axis = s.attrs.as<AxisAttrs>().axis;
      int64_t start = 0;
      for (const Operand& o : s.out) {
        Refined n = r;
        int64_t offset = in[0].offset;
        if (!narrow(n, offset, axis, start, o.shape[axis], 1)) return std::nullopt;
        start += o.shape[axis];
        m.out.push_back(output(n, offset));
      }
      return m;
    }
    case Op::Concat: {
      const int axis = s.attrs.as<AxisAttrs>().axis;
      const Shape& shape = s.out[0].shape;
      std::vector<int64_t> contiguous(shape.rank());
      for (int64_t d = shape.rank() - 1, st = 1; d >= 0; st *= shape[d], --d) contiguous[d] = st;
      int64_t start = 0;
      for (size_t k = 0; k < s.in.size(); ++k) {
        const Refined& rk = m.in[k];
        std::vector<int64_t> strides(rk.dims.size());
        for (int64_t d = static_cast<int64_t>(rk.dims.size()) - 1, inner = 1; d >= 0; --d) {
          const bool same =
              d + 1 < static_cast<int64_t>(rk.dims.size()) && rk.axis[d + 1] == rk.axis[d];
          inner = same ? inner * rk.dims[d + 1].size : 1;
          strides[d] = contiguous[rk.axis[d]] * inner;
        }
        m.out_strides.push_back(std::move(strides));
        m.out_offset.push_back(start * contiguous[axis]);
        start += s.in[k].shape[axis];
      }
      return m;
    }
    default:
      return std::nullopt;
  }
}

// A piece of dims.size elements read at dims.stride and written at out_strides, with size-1
// dimensions dropped and those walked contiguously in both buffers merged (as make_strided_loop
// does: the kernels take the piece's dimensions as they are); false past StridedPiece::kMaxRank.
bool make_piece(int input, int64_t in_offset, int64_t out_offset, const std::vector<Dim>& dims,
                const std::vector<int64_t>& out_strides, StridedPiece& p) {
  p = StridedPiece{};
  p.input = input;
  p.in_offset = in_offset;
  p.out_offset = out_offset;
  int r = 0;
  for (size_t d = 0; d < dims.size(); ++d) {
    const auto [size, stride] = dims[d];
    if (size == 1) continue;
    if (r > 0 && p.in_strides[r - 1] == stride * size &&
        p.out_strides[r - 1] == out_strides[d] * size) {
      p.dims[r - 1] *= size;
      p.in_strides[r - 1] = stride;
      p.out_strides[r - 1] = out_strides[d];
      continue;
    }
    if (r == StridedPiece::kMaxRank) return false;
    p.dims[r] = size;
    p.in_strides[r] = stride;
    p.out_strides[r] = out_strides[d];
    ++r;
  }
  p.rank = std::max(r, 1);
  return true;
}

// The piece writing a whole output, contiguously, from view v.
bool piece_of(const View& v, int input, StridedPiece& p) {
  std::vector<int64_t> out(v.dims.size());
  for (int64_t d = static_cast<int64_t>(v.dims.size()) - 1, st = 1; d >= 0;
       st *= v.dims[d].size, --d)
    out[d] = st;
  return make_piece(input, v.offset, 0, v.dims, out, p);
}

}  // namespace

void Rewriter::fold_layouts(std::vector<std::unique_ptr<StridedCopyProgram>>& programs) {
  const int n = static_cast<int>(steps_.size());
  std::vector<Op> recorded_op(n);  // the steps' ops before any is replaced (for the notes)
  for (int t = 0; t < n; ++t) recorded_op[t] = steps_[t].op;
  // A layout step of non-empty values, whose outputs have its input's dtype.
  auto layout_step = [&](int t) {
    const Step& s = steps_[t];
    if (!is_layout(s.op) || drop_[t] || !after_[t].empty()) return false;
    for (const Operand& i : s.in)
      if (i.shape.numel() == 0) return false;
    for (const Operand& o : s.out)
      if (o.dtype != s.in[0].dtype || o.shape.numel() == 0) return false;
    return true;
  };
  // Whether the call needs output o written: something reads it, or it leaves the call.
  auto needed = [&](const Operand& o) {
    return !readers(o).empty() || escape_[o.buf] >= 0 || bufs_[o.buf].kind != BufKind::Temp;
  };
  // Values that may be folded: written by a layout step other than a concat, read whole and only
  // by later layout steps of the phase.
  std::vector<char> folded(bufs_.size(), 0);
  for (int t = 0; t < n; ++t) {
    if (!layout_step(t) || steps_[t].op == Op::Concat) continue;
    for (const Operand& o : steps_[t].out) {
      if (!private_value(o, t) || o.shape.numel() == 0 || readers(o).empty()) continue;
      bool ok = true;
      for (int r : readers(o)) {
        ok = ok && r > t && layout_step(r) && same_phase(r, t);
        for (const Operand& i : steps_[r].in)  // o itself, whole (no alias of its storage)
          ok = ok &&
               (memory_[i.buf] != memory_[o.buf] || (i.buf == o.buf && i.nbytes() == o.nbytes()));
      }
      folded[o.buf] = ok;
    }
  }

  // Each layout step's inputs as views, given the values folded so far; a value a reader cannot
  // take (its shape does not split the view, a slice across dimensions, the first buffer written
  // in between, too many dimensions) is not folded, and the walk starts again.
  std::vector<std::optional<View>> views(bufs_.size());
  auto base = [&](int t, size_t k) {
    const Operand& i = steps_[t].in[k];
    if (folded[i.buf] && views[i.buf]) return *views[i.buf];
    return View{i, t, 0, {Dim{i.shape.numel(), 1}}, {}};
  };
  auto unfold_inputs = [&](int t) {
    bool any = false;
    for (const Operand& i : steps_[t].in)
      if (folded[i.buf]) {
        folded[i.buf] = 0;
        any = true;
      }
    return any;
  };
  std::vector<std::optional<Moved>> moved(n);
  // The pieces of concat t (its inputs' views in `in`) into `program`, reading the buffers
  // `copy` lists (each added at its first read); false past StridedPiece::kMaxRank.
  auto concat_pieces = [&](int t, const std::vector<View>& in, StridedCopyProgram& program,
                           Step& copy) {
    const Moved& m = *moved[t];
    for (size_t i = 0; i < in.size(); ++i) {
      int input = 0;
      while (
          input < static_cast<int>(copy.in.size()) &&
          (copy.in[input].buf != in[i].root.buf || copy.in[input].nbytes() != in[i].root.nbytes()))
        ++input;
      if (input == static_cast<int>(copy.in.size())) copy.in.push_back(in[i].root);
      if (!make_piece(input, in[i].offset, m.out_offset[i], m.in[i].dims, m.out_strides[i],
                      program.pieces.emplace_back()))
        return false;
    }
    return true;
  };
  for (bool again = true; again;) {
    again = false;
    std::fill(views.begin(), views.end(), std::nullopt);
    for (int t = 0; t < n && !again; ++t) {
      if (!layout_step(t)) continue;
      const Step& s = steps_[t];
      std::vector<View> in;
      for (size_t k = 0; k < s.in.size(); ++k) {
        in.push_back(base(t, k));
        const std::vector<int>& w = writers(in.back().root);
        if (std::any_of(w.begin(), w.end(),
                        [&](int x) { return x > in.back().root_reader && x < t; })) {
          folded[s.in[k].buf] = 0;
          again = true;
        }
      }
      if (again) break;
      // A split that folds anything writes each part it must as a copy of its own: past one
      // copy, it stays a split (one launch) with its input and outputs written.
      if (s.op == Op::Split) {
        int copies = 0;
        for (const Operand& o : s.out) copies += !folded[o.buf] && needed(o);
        if (copies > 1) {
          again = unfold_inputs(t);
          for (const Operand& o : s.out)
            if (folded[o.buf]) {
              folded[o.buf] = 0;
              again = true;
            }
          if (again) break;
        }
      }
      moved[t] = move_through(s, in);
      bool fits = moved[t].has_value();
      if (fits && s.op == Op::Concat) {
        StridedCopyProgram program;
        Step copy;
        fits = concat_pieces(t, in, program, copy);
      } else if (fits) {
        for (size_t k = 0; k < s.out.size(); ++k) {
          View& v = *moved[t]->out[k];
          v.through.push_back(t);
          StridedPiece p;
          fits = fits && piece_of(v, 0, p);
          if (folded[s.out[k].buf]) views[s.out[k].buf] = v;
        }
      }
      if (!fits) {
        moved[t].reset();
        again = unfold_inputs(t);
        for (const Operand& o : s.out)
          if (folded[o.buf]) {
            folded[o.buf] = 0;
            again = true;
          }
      }
    }
  }

  std::vector<StridedCopyProgram*> single(n, nullptr);  // the program of t's only copy
  for (int t = 0; t < n; ++t) {
    if (!layout_step(t) || !moved[t]) continue;
    const Step& s = steps_[t];
    bool reads_folded = false;
    for (const Operand& i : s.in) reads_folded = reads_folded || folded[i.buf];
    size_t outputs_folded = 0, unwritten = 0;  // unwritten: folded, or not needed
    for (const Operand& o : s.out) {
      outputs_folded += folded[o.buf];
      unwritten += folded[o.buf] || !needed(o);
    }
    if (!reads_folded && outputs_folded == 0) continue;
    if (unwritten == s.out.size()) {
      drop_[t] = 1;
      continue;
    }
    std::vector<View> in;
    for (size_t k = 0; k < s.in.size(); ++k) in.push_back(base(t, k));
    std::vector<Step> made;
    for (size_t k = 0; k < s.out.size(); ++k) {
      const Operand& o = s.out[k];
      if (folded[o.buf] || !needed(o)) continue;
      auto program = std::make_unique<StridedCopyProgram>();
      program->recorded.push_back({s.index, s.out.size() > 1 ? static_cast<int>(k) : -1});
      Step copy{Op::StridedCopy, AttrBlob::of(StridedCopyAttrs{program.get()}), s.index, {}, {o}};
      std::vector<int> through;
      if (s.op == Op::Concat) {
        concat_pieces(t, in, *program, copy);  // fits: checked above
        for (const View& v : in) through.insert(through.end(), v.through.begin(), v.through.end());
        through.push_back(t);
      } else {
        const View& v = *moved[t]->out[k];
        copy.in.push_back(v.root);
        piece_of(v, 0, program->pieces.emplace_back());  // fits: checked above
        through = v.through;
      }
      std::string ops, recorded_steps;
      for (size_t i = 0; i < through.size(); ++i) {
        const int index = steps_[through[i]].index;
        const char* sep = i == 0 ? "" : i + 1 == through.size() ? " and " : ", ";
        ops += cat(sep, op_name(recorded_op[through[i]]));
        recorded_steps += index >= 0 ? cat(sep, recorded(index)) : cat(sep, "a plan copy");
      }
      note(o.buf, cat(ops, " in one: recorded as steps ", recorded_steps));
      programs.push_back(std::move(program));
      made.push_back(std::move(copy));
    }
    if (made.size() == 1) single[t] = programs.back().get();
    steps_[t] = std::move(made[0]);
    for (size_t k = 1; k < made.size(); ++k) after_[t].push_back(std::move(made[k]));
  }
  merge_side_by_side(single);
}

// Copies from one buffer side by side (the q, k and v of attention's head split, each a chain
// from the projection) become one step writing all their outputs, one launch on CUDA: copies of
// one phase with nothing between them but dropped steps, each reading that buffer (the same
// view) as its only input, up to kMaxOpOutputs. The steps between run nothing, so each copy
// moving up to the first changes no value.
void Rewriter::merge_side_by_side(const std::vector<StridedCopyProgram*>& single) {
  const int n = static_cast<int>(steps_.size());
  for (int t = 0; t < n; ++t) {
    if (single[t] == nullptr || drop_[t] || steps_[t].in.size() != 1) continue;
    Step& head = steps_[t];
    const Operand& root = head.in[0];
    StridedCopyProgram& into = *single[t];
    int merged = 1;
    for (int u = t + 1; u < n && head.out.size() < static_cast<size_t>(kMaxOpOutputs); ++u) {
      if (drop_[u] && after_[u].empty()) continue;  // runs nothing
      const Step& next = steps_[u];
      if (single[u] == nullptr || drop_[u] || !same_phase(t, u) || next.in.size() != 1 ||
          next.in[0].buf != root.buf || next.in[0].nbytes() != root.nbytes())
        break;
      for (StridedPiece p : single[u]->pieces) {
        p.output = static_cast<int>(head.out.size());
        into.pieces.push_back(p);
      }
      into.recorded.push_back(single[u]->recorded[0]);
      head.out.push_back(next.out[0]);
      drop_[u] = 1;
      ++merged;
    }
    if (merged > 1) note(head.out[0].buf, cat(merged, " copies from one buffer in one step"));
  }
}

// Layout folds run on every device, where fusion is on (ENCORE_STATIC_FUSE).
void Plan::fold_layouts() {
  const std::vector<int> memory = storage_ids();
  Rewriter r(all_, n_forward_, rec_->buffers, escape_, memory, recorded_forward_, rewrite_notes_);
  r.fold_layouts(layout_programs_);
  r.finish();
}

}  // namespace encore::schedule
