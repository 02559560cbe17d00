// Elementwise fusion: runs of adjacent elementwise steps, and row ops over their last axis,
// become one FusedElementwise step whose program (runtime/fused.h) keeps values only the
// run reads in scratch blocks (cpu) or registers (CUDA, where the backend compiles the program
// into one kernel).
#include <algorithm>
#include <array>
#include <atomic>
#include <iterator>
#include <memory>
#include <string>

#include "runtime/fused.h"
#include "schedule/plan.h"

namespace encore::schedule {
namespace {

std::atomic<int> g_refused_programs{0};  // refuse_next_fused_programs

using Layout = FusedLayout;

// What a run is over: one dtype, `numel` elements seen as rows of `row` (its last axis).
struct RunShape {
  DType dtype = DType::Float32;
  int64_t numel = 0;
  int64_t row = 1;
  int64_t rows() const { return numel / row; }
};

// The shape a step works over: its output's, or its first input's for a row op.
const Operand& reference(const Step& s) {
  return op_row_fusable(s.op) ? s.in[0] : s.out[0];
}
int64_t last_axis(const Shape& s) {
  return s.rank() > 0 ? s[s.rank() - 1] : 1;
}

// Whether a row-fusable step works along the last axis of its first input, over rows of 2 or more
// elements that a fused program on `device` takes (fused_row_op), every other input of that shape
// (or one row, for layer_norm's gamma and beta). Here goes a new row op's own test.
bool row_op_fits(const Step& s, DeviceType device) {
  const Shape& x = s.in[0].shape;
  const int rank = x.rank();
  if (rank == 0 || x[rank - 1] < 2 || !fused_row_op(device, s.op, x[rank - 1])) return false;
  const int64_t c = x[rank - 1];
  if (s.op == Op::LayerNorm) {
    // normalized_shape [C] (or [1, ..., C]: the same rows); gamma and beta [C] or [1, ..., C].
    if (s.attrs.as<LayerNormAttrs>().cols != c) return false;
    for (size_t k = 1; k < s.in.size(); ++k)
      if (s.in[k].shape.numel() != c || last_axis(s.in[k].shape) != c) return false;
    return true;
  }
  for (const Operand& i : s.in)
    if (!(i.shape == x)) return false;
  switch (s.op) {
    case Op::Sum:
    case Op::Mean:
    case Op::Max:
      return s.attrs.as<ReduceAttrs>().axes_mask == 1u << (rank - 1);
    case Op::Softmax:
    case Op::LogSoftmax:
    case Op::SoftmaxGrad:
    case Op::LogSoftmaxGrad:
      return s.attrs.as<AxisAttrs>().axis == rank - 1;
    default:
      return false;
  }
}

// The layout of a row op's input k: layer_norm's gamma and beta are one row, the rest the input's.
Layout row_op_input(Op op, size_t k) {
  return op == Op::LayerNorm && k > 0 ? Layout::Row : Layout::Full;
}

// The layout of a row op's output k: one value per row for a reduction and for layer_norm's mean
// and rstd, else the input's.
Layout row_op_output(Op op, size_t k) {
  if (row_reduction(op)) return Layout::Column;
  return op == Op::LayerNorm && k > 0 ? Layout::Column : Layout::Full;
}

// The layout a step of a run writes output k in.
Layout output_layout(const Step& s, size_t k) {
  return op_row_fusable(s.op) ? row_op_output(s.op, k) : Layout::Full;
}

// Whether s may read operands broadcast to its output: a binary op's, or where's.
bool reads_broadcast(Op op) {
  return op_broadcasts_one(op) || op == Op::Where;
}

// Whether `from` broadcasts to `to` over leading axes only: its dimensions, past leading ones, are
// `to`'s last ones.
bool tiles(const Shape& from, const Shape& to) {
  int lead = 0;
  while (lead < from.rank() && from[lead] == 1) ++lead;
  const int rank = from.rank() - lead;
  if (rank > to.rank()) return false;
  for (int d = 0; d < rank; ++d)
    if (from[lead + d] != to[to.rank() - rank + d]) return false;
  return true;
}

// How operand i of a step s over `run` reads a buffer from outside the run, or false: the run's
// element count, or (a binary op or where, whose output's last axis is the run's) one element,
// one row, one value per row, or a tile repeated over the output's leading axes.
bool input_layout(const Step& s, const Operand& i, const RunShape& run, Layout& l) {
  const int64_t k = i.shape.numel();
  if (k == run.numel) {
    l = Layout::Full;
    return true;
  }
  if (!reads_broadcast(s.op)) return false;
  if (k == 1) {
    l = Layout::One;
    return true;
  }
  if (run.row < 2 || last_axis(s.out[0].shape) != run.row) return false;
  if (last_axis(i.shape) == run.row && k == run.row) {
    l = Layout::Row;
    return true;
  }
  if (last_axis(i.shape) == 1 && k == run.rows()) {
    l = Layout::Column;
    return true;
  }
  if (last_axis(i.shape) == run.row && k > 0 && run.numel % k == 0 &&
      tiles(i.shape, s.out[0].shape)) {
    l = Layout::Tile;
    return true;
  }
  return false;
}

}  // namespace

// Runs of adjacent steps of one phase and dtype over one element count become one
// FusedElementwise step: elementwise steps and where, whose operands may be broadcast along or
// across the rows or tiled, and row ops over the last axis (those the device's fused kernels have:
// fused_row_op). Its kernel runs the steps block by block (cpu), element by element or a warp per
// row (CUDA): a value only the run reads lives in a scratch block or a register
// (never in the arena), and one the rest of the schedule reads (a saved activation, a result, a
// gradient) is an output of the fused step. A program the device's backend cannot prepare (CUDA
// without NVRTC) leaves its steps as they were, and the plan says why.
void Plan::fuse_elementwise() {
  const std::vector<Buffer>& bufs = rec_->buffers;
  const int n = static_cast<int>(all_.size());
  std::vector<int> last_read(bufs.size(), -1);
  for (int t = 0; t < n; ++t)
    for (const Operand& o : all_[t].in) last_read[o.buf] = t;

  std::vector<int> group_of(bufs.size(), -1);  // per buffer: the run producing it (its start)
  std::vector<Layout> produced(bufs.size());   // per buffer the run produces: its layout
  // A buffer read in two layouts (two arguments may alias one buffer with different shapes) is
  // two inputs: reg and last_in are per read, indexed by key = kFusedLayouts * buffer + layout.
  auto key = [](int buf, Layout l) { return kFusedLayouts * buf + static_cast<int>(l); };
  std::vector<int> reg(kFusedLayouts * bufs.size(), -1);      // per read: its register in the run
  std::vector<int> last_in(kFusedLayouts * bufs.size(), -1);  // per read: its last in the run
  using Reads = std::array<Layout, 3>;
  std::vector<Reads> layouts;  // per step of the current run: its reads'

  // Whether s can join the run starting at t, and how it reads its operands (into l).
  auto joins = [&](const Step& s, const RunShape& run, int t, Reads& l) {
    if (s.out.empty() || s.out.size() > FusedInstr::kMaxOutputs || s.in.empty() ||
        s.in.size() > l.size())
      return false;
    const bool row_op = op_row_fusable(s.op);
    if (!op_fusable(s.op) && !(row_op && row_op_fits(s, device_.type))) return false;
    for (size_t k = 0; k < s.out.size(); ++k) {
      const Operand& o = s.out[k];
      if (o.dtype != run.dtype || bufs[o.buf].kind != BufKind::Temp ||
          o.shape.numel() != (output_layout(s, k) == Layout::Column ? run.rows() : run.numel))
        return false;
    }
    if (row_op && (s.in[0].shape.numel() != run.numel || last_axis(s.in[0].shape) != run.row))
      return false;
    for (size_t k = 0; k < s.in.size(); ++k) {
      const Operand& i = s.in[k];
      // where's condition is bool, read from outside (a run writes values of its dtype only).
      if (i.dtype != (s.op == Op::Where && k == 0 ? DType::Bool : run.dtype)) return false;
      if (group_of[i.buf] == t) {  // produced by the run: read as it was written
        l[k] = produced[i.buf];
        const int64_t m = i.shape.numel();
        if (l[k] == Layout::Full
                ? m != run.numel || (row_op && row_op_input(s.op, k) != Layout::Full)
                : row_op || !reads_broadcast(s.op) || m != run.rows() ||
                      (m > 1 && (last_axis(i.shape) != 1 || last_axis(s.out[0].shape) != run.row)))
          return false;
      } else if (row_op) {  // row_op_fits checked the shapes
        l[k] = row_op_input(s.op, k);
        if (l[k] == Layout::Full && i.shape.numel() != run.numel) return false;
      } else if (!input_layout(s, i, run, l[k])) {
        return false;
      }
    }
    return true;
  };

  std::vector<Step> steps;
  int n_forward = 0;
  // Each fused step made: where it is in `steps`, its program and the steps it stands for, which
  // come back where the device's backend cannot run the program.
  struct Made {
    size_t at;
    FusedProgram* program;
    std::vector<Step> steps;
  };
  std::vector<Made> made;
  for (int t = 0; t < n;) {
    const Step& first = all_[t];
    const int phase_end = t < n_forward_ ? n_forward_ : n;
    int e = t;
    layouts.clear();
    RunShape run;
    if (!first.out.empty() && !first.in.empty() &&
        (first.out[0].dtype == DType::Float32 || first.out[0].dtype == DType::Float64)) {
      const Operand& r = reference(first);
      run = RunShape{first.out[0].dtype, r.shape.numel(), std::max<int64_t>(1, last_axis(r.shape))};
      int inputs = 0, values = 0;  // values: written by the run's steps
      Reads l{};
      while (e < phase_end && e - t < FusedProgram::kMaxSteps && joins(all_[e], run, t, l)) {
        const Step& s = all_[e];
        int fresh = 0;  // inputs the run does not read yet (one counted twice at worst)
        for (size_t k = 0; k < s.in.size(); ++k)
          fresh += group_of[s.in[k].buf] != t && last_in[key(s.in[k].buf, l[k])] < t;
        if (inputs + fresh > FusedProgram::kMaxInputs ||
            values + static_cast<int>(s.out.size()) > FusedProgram::kMaxSteps)
          break;
        for (size_t k = 0; k < s.in.size(); ++k) {
          if (group_of[s.in[k].buf] != t && last_in[key(s.in[k].buf, l[k])] < t) ++inputs;
          last_in[key(s.in[k].buf, l[k])] = e;
        }
        for (size_t k = 0; k < s.out.size(); ++k) {
          group_of[s.out[k].buf] = t;
          produced[s.out[k].buf] = output_layout(s, k);
        }
        values += static_cast<int>(s.out.size());
        layouts.push_back(l);
        ++e;
      }
    }
    if (t < n_forward_) n_forward += 1;
    if (e - t < 2) {
      steps.push_back(std::move(all_[t]));
      t += 1;
      continue;
    }

    auto program = std::make_unique<FusedProgram>();
    FusedProgram& p = *program;
    p.dtype = run.dtype;
    p.numel = run.numel;
    p.row = run.row;
    Step fused{Op::FusedElementwise, AttrBlob::of(FusedAttrs{program.get()}), -1, {}, {}};
    // Inputs in order of first read; then which produced values leave the run (outputs) and
    // which live in scratch slots, reused once their last reader inside the run has read them.
    std::vector<int> touched;
    for (int j = t; j < e; ++j) {
      const Step& s = all_[j];
      p.row_ops |= op_row_fusable(s.op);
      for (size_t k = 0; k < s.in.size(); ++k) {
        const Layout l = layouts[j - t][k];
        p.by_rows |= l == Layout::Row || l == Layout::Column || l == Layout::Tile;
        if (const int r = key(s.in[k].buf, l); group_of[s.in[k].buf] != t && reg[r] < 0) {
          reg[r] = p.n_in++;
          p.in_layout.push_back(l);
          p.in_tile.push_back(l == Layout::Tile ? s.in[k].shape.numel() : 0);
          p.in_bool.push_back(s.in[k].dtype == DType::Bool);
          touched.push_back(r);
          fused.in.push_back(s.in[k]);
        }
      }
    }
    p.by_rows |= p.row_ops;
    auto scratch_slot = [&](int b) {  // the scratch slot holding b, or -1
      const int k = reg[key(b, produced[b])] - p.n_in;
      return group_of[b] == t && k >= 0 && k < FusedProgram::kMaxScratch ? k : -1;
    };
    bool used[FusedProgram::kMaxScratch] = {};
    // A value read for the last time frees its slot: before the step's output takes one when the
    // step reads it element for element (an elementwise step over a Full value), after otherwise
    // (a row op reads whole rows before it writes; a value per row is read while the block is
    // written).
    auto free_slots = [&](const Step& s, int j, bool before) {
      const bool row_op = op_row_fusable(s.op);
      for (const Operand& i : s.in)
        if (const int k = scratch_slot(i.buf);
            k >= 0 && last_in[key(i.buf, produced[i.buf])] == j &&
            before == (!row_op && produced[i.buf] == Layout::Full))
          used[k] = false;
    };
    for (int j = t; j < e; ++j) {
      const Step& s = all_[j];
      free_slots(s, j, true);
      for (size_t o = 0; o < s.out.size(); ++o) {
        const int b = s.out[o].buf;
        const int r = key(b, produced[b]);
        touched.push_back(r);
        int free_slot = -1;
        if (escape_[b] < 0 && last_read[b] < e && last_in[r] >= 0)
          for (int k = 0; k < FusedProgram::kMaxScratch && free_slot < 0; ++k)
            if (!used[k]) free_slot = k;
        if (free_slot >= 0) {
          used[free_slot] = true;
          reg[r] = p.scratch_reg(free_slot);
          p.n_scratch = std::max(p.n_scratch, free_slot + 1);
        } else {  // read after the run (a layer_norm's mean and rstd by its gradient), or no slot
          reg[r] = p.out_reg(p.n_out++);
          p.out_instr.push_back({j - t, static_cast<int>(o)});
          p.out_column.push_back(produced[b] == Layout::Column);
          fused.out.push_back(s.out[o]);
        }
      }
      free_slots(s, j, false);
    }
    for (int j = t; j < e; ++j) {
      const Step& s = all_[j];
      const Reads& l = layouts[j - t];
      auto read = [&](size_t k) { return static_cast<uint8_t>(reg[key(s.in[k].buf, l[k])]); };
      FusedInstr ins;
      ins.op = s.op;
      ins.n_out = static_cast<uint8_t>(s.out.size());
      for (size_t o = 0; o < s.out.size(); ++o)
        ins.out[o] = static_cast<uint8_t>(reg[key(s.out[o].buf, produced[s.out[o].buf])]);
      ins.a = read(0);
      ins.la = l[0];
      if (s.op == Op::LayerNorm) {  // x, then gamma and beta as `affine` says: b gamma, c beta
        const LayerNormAttrs& a = s.attrs.as<LayerNormAttrs>();
        ins.flags = a.affine;
        ins.scalar = a.eps;
        size_t next = 1;
        if (a.affine & kLayerNormGamma) {
          ins.b = read(next);
          ins.lb = l[next++];
        }
        if (a.affine & kLayerNormBeta) {
          ins.c = read(next);
          ins.lc = l[next];
        }
      } else {
        ins.b = s.in.size() > 1 ? read(1) : ins.a;
        ins.lb = s.in.size() > 1 ? l[1] : l[0];
        if (s.in.size() > 2) {  // where: a the condition, b and c the values
          ins.c = read(2);
          ins.lc = l[2];
        }
      }
      if (op_has_scalar_attrs(s.op)) ins.scalar = s.attrs.as<ScalarAttrs>().value;
      p.instrs.push_back(ins);
      p.trace_index.push_back(s.index);
    }
    for (int k : touched) reg[k] = -1;
    made.push_back({steps.size(), program.get(),
                    std::vector<Step>(std::make_move_iterator(all_.begin() + t),
                                      std::make_move_iterator(all_.begin() + e))});
    programs_.push_back(std::move(program));
    steps.push_back(std::move(fused));
    t = e;
  }
  // The backend prepares every program at once (CUDA: one NVRTC compile for the plan).
  std::vector<FusedProgram*> programs;
  for (const Made& m : made) programs.push_back(m.program);
  std::vector<std::string> why = prepare_fused(programs, device_);
  for (std::string& reason : why)
    if (reason.empty() && g_refused_programs.load(std::memory_order_relaxed) > 0 &&
        g_refused_programs.fetch_sub(1, std::memory_order_relaxed) > 0)
      reason = "refused on purpose (refuse_next_fused_programs)";
  all_.clear();
  const int fused_forward = n_forward;  // steps of `steps` in the forward
  size_t next = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (next < made.size() && made[next].at == i) {
      Made& m = made[next];
      if (const std::string& reason = why[next++]; !reason.empty()) {
        if (unfused_reason_.empty()) unfused_reason_ = reason;
        if (static_cast<int>(i) < fused_forward) n_forward += static_cast<int>(m.steps.size()) - 1;
        std::erase_if(programs_, [&](const auto& p) { return p.get() == m.program; });
        for (Step& original : m.steps) all_.push_back(std::move(original));
        continue;
      }
    }
    all_.push_back(std::move(steps[i]));
  }
  n_forward_ = n_forward;
}

void refuse_next_fused_programs(int n) {
  g_refused_programs.store(n, std::memory_order_relaxed);
}

}  // namespace encore::schedule
