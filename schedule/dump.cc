// The schedule dump: a plan's steps as text (steps_text) and as Graphviz (steps_dot), and where
// each buffer lives (location).
#include <cstdio>
#include <optional>

#include "runtime/fused.h"
#include "schedule/plan.h"

namespace encore::schedule {
namespace {

std::string named(const std::vector<std::string>& names, int i, std::string_view what) {
  if (i >= 0 && i < static_cast<int>(names.size()) && !names[i].empty())
    return cat(what, " ", i, " '", names[i], "'");
  return cat(what, " ", i);
}

// A fused step's instructions, one per line: "out 1 = tanh(scratch 0)", "scratch 1 =
// sub(in 0, scratch 0 (one per row))", "scratch 0 = where(in 1 (a tile of 4096), in 2, in 0)".
std::string fused_text(const FusedProgram& p, const std::string& indent) {
  auto name = [&p](int r) {
    if (r < p.n_in) return cat("in ", r);
    if (r < p.out_reg(0)) return cat("scratch ", r - p.scratch_reg(0));
    return cat("out ", r - p.out_reg(0));
  };
  auto read = [&](int r, FusedLayout l) {
    switch (l) {
      case FusedLayout::Row:
        return cat(name(r), " (one row)");
      case FusedLayout::Column:
        return cat(name(r), " (one per row)");
      case FusedLayout::Tile:
        return cat(name(r), " (a tile of ", p.tile(r), ")");
      default:
        return name(r);
    }
  };
  std::string out;
  for (const FusedInstr& ins : p.instrs) {
    out += cat(indent, name(ins.out[0]));
    for (int k = 1; k < ins.n_out; ++k) out += cat(", ", name(ins.out[k]));
    out += cat(" = ", op_name(ins.op), "(", read(ins.a, ins.la));
    if (op_reads_two(ins.op) || ins.op == Op::Where) out += cat(", ", read(ins.b, ins.lb));
    if (ins.op == Op::Where) out += cat(", ", read(ins.c, ins.lc));
    if (ins.op == Op::LayerNorm) {
      if (ins.flags & kLayerNormGamma) out += cat(", gamma ", read(ins.b, ins.lb));
      if (ins.flags & kLayerNormBeta) out += cat(", beta ", read(ins.c, ins.lc));
      out += cat(", eps ", ins.scalar);
    }
    if (op_has_scalar_attrs(ins.op)) out += cat(", ", ins.scalar);
    out += ")\n";
  }
  return out;
}

std::string attrs_note(const Step& s) {
  if (op_has_scalar_attrs(s.op)) return cat("scalar ", s.attrs.as<ScalarAttrs>().value);
  return {};
}

}  // namespace

std::string dot_quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string Plan::location(int buf, const Names& names) const {
  const Buffer& b = rec_->buffers[buf];
  auto param = [&](int slot) {
    return slot >= 0 && slot < static_cast<int>(names.params.size())
               ? cat("param '", names.params[slot], "'")
               : cat("param slot ", slot);
  };
  switch (b.kind) {
    case BufKind::Arg:
      return named(names.args, b.index, "arg");
    case BufKind::Param:
      return param(b.index);
    case BufKind::External:
      return "external (bound by reference)";
    case BufKind::GradSlot: {
      const Leaf& l = rec_->leaves[b.index];
      return cat(".grad of ", l.param >= 0 ? param(l.param) : cat("captured leaf ", b.index),
                 " (as the call finds it)");
    }
    case BufKind::GradIn:
      return cat("incoming gradient of output ",
                 b.index < static_cast<int>(rec_->differentiable.size())
                     ? rec_->differentiable[b.index]
                     : b.index);
    case BufKind::Temp:
      break;
  }
  if (const int64_t off = arena_offset(buf); off >= 0) {
    const int64_t end = off + static_cast<int64_t>(b.nbytes);
    std::string where = cat("arena [", off, ",", end, ")");
    if (memory_.redzone_bytes > 0)
      where +=
          cat(", red zone [", end, ",", off + arena_aligned(b.nbytes, align_) + kRedzoneBytes, ")");
    if (buf < static_cast<int>(padded_.size()) && padded_[buf].image > 0) {
      const PaddedBuffer& p = padded_[buf];
      where += cat(", padded ", p.pad_h, ",", p.pad_w, " (", p.hp, "x", p.wp, " planes)");
    }
    return where;
  }
  if (escape_[buf] < 0) return "not planned";
  for (size_t k = 0; k < results_.size(); ++k)
    if (results_[k].buf == buf) return cat("own storage (result ", k, ")");
  for (size_t k = 0; k < grads_.size(); ++k) {
    if (grads_[k].buf != buf) continue;
    const Recording::Contribution& c = rec_->contributions[k];
    const Leaf* l = c.arg ? nullptr : &rec_->leaves[c.index];
    return cat("own storage (gradient ", k, " for ",
               c.arg           ? named(names.args, c.index, "arg")
               : l->param >= 0 ? param(l->param)
                               : cat("captured leaf ", c.index),
               ")");
  }
  for (const Leaf& l : rec_->leaves)
    if (l.final_grad == buf)
      return cat("own storage (new .grad of ",
                 l.param >= 0 ? param(l.param) : std::string("a captured leaf"), ")");
  return "own storage";
}

const std::string* Plan::rewrite_note(const Step& s) const {
  // Its first output; a WeightGradAdam's weight gradient (update_folds.cc). A step that writes what
  // a copy_ wrote has none (fold_copies folds no rewritten step; its output's note would be the
  // note of the destination's earlier writer).
  if (s.folded_copy >= 0) return nullptr;
  const int first = s.op == Op::WeightGradAdam ? s.in[3].buf : s.out.empty() ? -1 : s.out[0].buf;
  const auto it = rewrite_notes_.find(first);
  return it == rewrite_notes_.end() ? nullptr : &it->second;
}

std::string Plan::steps_text(const Names& names, const std::string& indent) const {
  std::string out;
  if (!unfused_reason_.empty())
    out += cat(indent, "elementwise runs left unfused: ", unfused_reason_, "\n");
  if (folded_constants_ > 0)
    out += cat(indent, folded_constants_, folded_constants_ == 1 ? " step" : " steps",
               " computing constants folded (their values bound from the trace)\n");
  if (memory_.redzone_bytes > 0)
    out += cat(indent, "red zones: ", memory_.redzone_bytes,
               " guard bytes after each arena block, checked after every step\n");
  char head[160];
  for (Phase phase : {Phase::Forward, Phase::Backward}) {
    const auto [begin, end] = step_range(phase);
    out += cat(indent, phase_name(phase), ": ", end - begin,
               end - begin == 1 ? " step\n" : " steps\n");
    // On CUDA the lanes are the streams of the phase's graphs (lanes.cc).
    const StreamQueue& queue = graph_queue_[phase];
    const bool streams = !queue.entries.empty();
    const bool lanes = streams || !lanes_[phase][1].empty();
    if (lanes) {
      int on[kMaxLanes] = {};
      for (int t = begin; t < end; ++t) ++on[step_lane_[t]];
      if (streams) {
        out += cat(indent, "  ", queue.streams, " streams (captured so in its CUDA graphs): ");
        for (int k = 0; k < queue.streams; ++k)
          out += cat(k == 0 ? "" : ", ", on[k], " on stream ", k);
        out += cat(", ordered by ", queue.marks, queue.marks == 1 ? " mark\n" : " marks\n");
      } else {
        out += cat(indent, "  two lanes (replayed so at two threads): ", on[0], " on lane 0, ",
                   on[1], " on lane 1, ", on[kBothLanes], " on both\n");
      }
    }
    for (int t = begin; t < end; ++t) {
      const Step& s = all_[t];
      std::string marks = attrs_note(s);
      auto mark = [&marks](std::string_view m) { marks += cat(marks.empty() ? "" : "; ", m); };
      if (op_draws_random(s.op)) mark("random");
      for (size_t k = 0; k < s.out.size(); ++k)
        if (in_place_input(s, static_cast<int>(k)) >= 0) mark("in place");
      if (op_mutated_inputs(s.op) != 0) mark("updates its input in place");
      if (s.live >= 0 && rec_->guard_live[s.live]) mark("hyper-parameters read at each call");
      const FusedProgram* fused =
          s.op == Op::FusedElementwise ? s.attrs.as<FusedAttrs>().program : nullptr;
      if (fused != nullptr && fused->device_kernel != nullptr)
        mark(cat("fuses ", fused->instrs.size(), " steps into one compiled kernel",
                 fused->by_rows ? cat(", by rows of ", fused->row) : std::string()));
      else if (fused != nullptr)
        mark(cat("fuses ", fused->instrs.size(), " steps, ", fused->n_scratch,
                 fused->n_scratch == 1 ? " scratch block" : " scratch blocks",
                 fused->by_rows ? cat(", by rows of ", fused->row) : std::string()));
      const std::string* rewrite = rewrite_note(s);
      if (rewrite != nullptr)
        mark(*rewrite);
      else if (fused == nullptr && s.index < 0)
        mark("added by the plan");
      if (const int f = folded_fill(s); f >= 0) {
        const int base = t < n_forward_ ? 0 : recorded_forward_;
        mark(cat("fill_ and add_ in one: recorded as steps ", f - base, " and ", s.index - base));
      }
      if (s.folded_copy >= 0)
        mark(cat("writes what copy_ wrote: recorded as step ",
                 s.folded_copy - (t < n_forward_ ? 0 : recorded_forward_)));
      if (moved_early(s))
        mark(cat("moved early: recorded as step ",
                 s.index - (t < n_forward_ ? 0 : recorded_forward_)));
      if (streams)
        mark(cat("stream ", int{step_lane_[t]}));
      else if (lanes)
        mark(step_lane_[t] == kBothLanes ? "both lanes" : cat("lane ", int{step_lane_[t]}));
      std::snprintf(head, sizeof head, marks.empty() ? "%s  %4d  %s" : "%s  %4d  %-26s",
                    indent.c_str(), t - begin, std::string(op_name(s.op)).c_str());
      out += head;
      if (!marks.empty()) out += cat("  [", marks, "]");
      out += "\n";
      auto operand = [&](std::string_view dir, size_t k, const Operand& o, std::string note) {
        std::snprintf(head, sizeof head, "%s          %-3s %zu  b%-5d %-22s ", indent.c_str(),
                      std::string(dir).c_str(), k, o.buf, cat(o.dtype, o.shape).c_str());
        out += cat(head, location(o.buf, names), note.empty() ? "" : "  " + note, "\n");
      };
      for (size_t k = 0; k < s.in.size(); ++k)
        operand("in", k, s.in[k], op_writes_input(s.op, k) ? "(written in place)" : "");
      for (size_t k = 0; k < s.out.size(); ++k) {
        const int over = in_place_input(s, static_cast<int>(k));
        operand("out", k, s.out[k], over >= 0 ? cat("(in place over in ", over, ")") : "");
      }
      if (fused != nullptr) out += fused_text(*fused, indent + "          ");
    }
  }
  return out;
}

std::string Plan::steps_dot(const Names& names, const std::string& prefix) const {
  // A buffer written by a step sits in the cluster of the first schedule writing it; bound
  // buffers (arguments, parameters, incoming gradients) sit outside both.
  const int nb = static_cast<int>(rec_->buffers.size());
  std::vector<const Operand*> seen(nb, nullptr);
  std::vector<std::optional<Phase>> home(nb);
  for (int t = 0; t < static_cast<int>(all_.size()); ++t) {
    const Phase phase = t < n_forward_ ? Phase::Forward : Phase::Backward;
    for (const Operand& o : all_[t].in)
      if (seen[o.buf] == nullptr) seen[o.buf] = &o;
    for (const Operand& o : all_[t].out) {
      if (seen[o.buf] == nullptr) seen[o.buf] = &o;
      if (!home[o.buf] && rec_->buffers[o.buf].kind == BufKind::Temp) home[o.buf] = phase;
    }
  }
  auto buffer_node = [&](int b, const char* indent) {
    return cat(
        indent, prefix, "b", b, " [shape=ellipse, label=",
        dot_quote(cat("b", b, " ", seen[b]->dtype, seen[b]->shape, "\n", location(b, names))),
        "];\n");
  };
  std::string out, edges;
  for (Phase phase : {Phase::Forward, Phase::Backward}) {
    const auto [begin, end] = step_range(phase);
    const char* what = phase_name(phase);
    out += cat("    subgraph cluster_", prefix, what, " {\n      label=\"", what, " (", end - begin,
               end - begin == 1 ? " step" : " steps", ")\";\n");
    for (int t = begin; t < end; ++t) {
      const Step& s = all_[t];
      bool in_place = false;
      for (size_t k = 0; k < s.out.size(); ++k)
        in_place |= in_place_input(s, static_cast<int>(k)) >= 0;
      const std::string note = attrs_note(s);
      const bool random = op_draws_random(s.op);
      out += cat("      ", prefix, "s", t, " [shape=box", random ? ", style=dashed" : "",
                 ", label=\"", phase == Phase::Forward ? "fwd " : "bwd ", t - begin, ": ",
                 op_name(s.op), note.empty() ? "" : "\\n" + note, in_place ? "\\n(in place)" : "",
                 random ? "\\n(random)" : "", moved_early(s) ? "\\n(moved early)" : "", "\"];\n");
      for (size_t k = 0; k < s.in.size(); ++k) {
        const int b = s.in[k].buf;
        edges += cat("    ", prefix, "b", b, " -> ", prefix, "s", t, ";\n");
        if (op_writes_input(s.op, k))
          edges += cat("    ", prefix, "s", t, " -> ", prefix, "b", b,
                       " [style=dashed, label=\"updates\"];\n");
      }
      for (size_t k = 0; k < s.out.size(); ++k)
        edges += cat(
            "    ", prefix, "s", t, " -> ", prefix, "b", s.out[k].buf,
            in_place_input(s, static_cast<int>(k)) >= 0 ? " [color=red, label=\"in place\"]" : "",
            ";\n");
    }
    for (int b = 0; b < nb; ++b)
      if (seen[b] != nullptr && home[b] == phase) out += buffer_node(b, "      ");
    out += "    }\n";
  }
  for (int b = 0; b < nb; ++b)
    if (seen[b] != nullptr && !home[b]) out += buffer_node(b, "    ");
  return out + edges;
}

}  // namespace encore::schedule
