// The plan's passes over a recording: outputs that leave the call get their own storage (a Copy
// where they alias something else), dead steps are dropped, a zero fill_ and the add_ into it
// become one step, an elementwise step and a copy_ of its result become one step writing the
// copy's destination, an elementwise step writes over an input that dies there, and the remaining
// temporaries are placed in the arena (memory_plan.h).
#include <algorithm>
#include <climits>
#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "runtime/fused.h"
#include "schedule/memory_plan.h"
#include "schedule/plan.h"

namespace encore::schedule {
namespace {

Device device_of(const Step& s, const Recording& rec) {
  const Operand& o = s.in.empty() ? s.out[0] : s.in[0];
  return rec.buffers[o.buf].device;
}

}  // namespace

Plan::Plan(std::shared_ptr<Recording> rec, PlanOptions options)
    : rec_(std::move(rec)), options_(options) {
  n_forward_ = static_cast<int>(rec_->forward.size());
  all_ = std::move(rec_->forward);
  for (Step& s : rec_->backward) all_.push_back(std::move(s));
  for (size_t t = 0; t < all_.size(); ++t) all_[t].index = static_cast<int>(t);
  trace_steps_ = all_;
  moved_early_.assign(trace_steps_.size(), 0);
  folded_fill_.assign(trace_steps_.size(), -1);
  recorded_forward_ = n_forward_;
  rec_->forward.clear();
  rec_->backward.clear();
  results_ = rec_->results;
  for (const Recording::Contribution& c : rec_->contributions) grads_.push_back(c.grad);
  add_copies();
  if (options_.fold_constants) fold_constants();
  eliminate_dead_steps();
  device_ = all_.empty() ? Device::cpu() : device_of(all_[0], *rec_);
  align_ = device_.type == DeviceType::CUDA ? kCudaArenaAlign : kArenaAlign;
  if (options_.fold_activations) rewrite_activations();
  if (options_.fuse && options_.fold_layouts) fold_layouts();
  move_collectives_early();
  if (options_.early_updates) {
    fold_zero_fills();
    move_updates_early();
  }
  if (options_.fold_activations && (device_.type == DeviceType::CUDA || options_.fold_cpu_updates))
    fold_updates();
  if (options_.fuse) {
    fuse_elementwise();
    fold_copies();
  }
  if (device_.type == DeviceType::CPU && options_.padded_layouts) plan_padded_layouts();
  plan_memory();
  build_steps();
  plan_value_checks();
  if (options_.lanes && !options_.redzones) plan_lanes();
  if (device_.type == DeviceType::CUDA) plan_graphs();
}

int add_temp_buffer(std::vector<Buffer>& bufs, std::vector<int>& escape, const Operand& like) {
  Buffer b;
  b.kind = BufKind::Temp;
  b.nbytes = like.nbytes();
  b.device = bufs[like.buf].device;
  bufs.push_back(std::move(b));
  escape.push_back(-1);
  return static_cast<int>(bufs.size()) - 1;
}

// Results and gradients leave the call: each gets a buffer of its own, written directly by
// the step that produces it, or a Copy where it is something else (an argument, a parameter,
// a forward value, another result's gradient).
void Plan::add_copies() {
  std::vector<Buffer>& bufs = rec_->buffers;
  std::vector<char> written_fwd(bufs.size(), 0), written_bwd(bufs.size(), 0);
  for (int t = 0; t < static_cast<int>(all_.size()); ++t)
    for (const Operand& o : all_[t].out) (t < n_forward_ ? written_fwd : written_bwd)[o.buf] = 1;
  escape_.assign(bufs.size(), -1);
  auto new_temp = [&](const Operand& like) {
    written_fwd.push_back(0);
    written_bwd.push_back(0);
    return add_temp_buffer(bufs, escape_, like);
  };
  auto copy_into_new = [&](Operand& o, int at) {
    Step s{Op::Copy, AttrBlob{}, -1, {o}, {}};
    Operand out{new_temp(o), o.shape, o.dtype};
    s.out.push_back(out);
    all_.insert(all_.begin() + at, std::move(s));
    o = out;
  };
  auto whole = [&](const Operand& o) { return o.nbytes() == bufs[o.buf].nbytes; };

  for (Operand& r : results_) {
    const Buffer& b = bufs[r.buf];
    // A result that is (a view of) an argument, parameter or bound tensor comes back as a view
    // of that tensor, as eagerly.
    if (b.kind != BufKind::Temp) continue;
    if (!written_fwd[r.buf] || written_bwd[r.buf]) {
      copy_into_new(r, n_forward_);
      ++n_forward_;
    }
    if (escape_[r.buf] < 0) escape_[r.buf] = escapes_++;
  }
  for (Leaf& l : rec_->leaves) {
    if (l.final_grad < 0 || bufs[l.final_grad].kind != BufKind::Temp) continue;
    if (escape_[l.final_grad] < 0) escape_[l.final_grad] = escapes_++;
  }
  for (Operand& g : grads_) {
    const bool own = bufs[g.buf].kind == BufKind::Temp && written_bwd[g.buf] &&
                     !written_fwd[g.buf] && escape_[g.buf] < 0 && whole(g);
    if (!own) copy_into_new(g, static_cast<int>(all_.size()));
    escape_[g.buf] = escapes_++;
  }
}

// A step whose every output is a constant (Buffer::constant: computed at the trace from values
// the function made itself, by a deterministic op) is not replayed: its outputs are bound by
// reference to their values at the trace, as a tensor() the function makes is (a buffer the step
// fills, as copy_ fills an empty(), is one of its outputs here). An output that leaves the call
// or that a step writes afterwards keeps its step (a size planned from a dynamic family folds
// nothing: instantiate() clears its constants). A replay reads what eager recomputes, so the
// bits are eager's.
void Plan::fold_constants() {
  std::vector<Buffer>& bufs = rec_->buffers;
  auto foldable = [&](const Operand& o) {
    const Buffer& b = bufs[o.buf];
    return b.kind == BufKind::Temp && b.constant && escape_[o.buf] < 0 && b.trace_value.defined() &&
           b.trace_value.shape() == o.shape && b.trace_value.dtype() == o.dtype;
  };
  std::vector<char> drop(all_.size(), 0);
  for (size_t t = 0; t < all_.size(); ++t) {
    const Step& s = all_[t];
    // What the step writes: its outputs, and the inputs it fills (an empty() it copies into).
    absl::InlinedVector<const Operand*, 2> written;
    for (const Operand& o : s.out) written.push_back(&o);
    for (size_t i = 0; i < s.in.size(); ++i)
      if (op_writes_input(s.op, i)) written.push_back(&s.in[i]);
    if (!written.empty() && std::all_of(written.begin(), written.end(),
                                        [&](const Operand* o) { return foldable(*o); })) {
      for (const Operand* o : written) {
        Buffer& b = bufs[o->buf];
        b.kind = BufKind::External;
        b.bound = b.trace_value;  // the recorder's own copy: no caller can write it
        b.mutated = false;        // (its filling step is gone: nothing writes it now)
      }
      ++folded_constants_;
      drop[t] = 1;
    }
  }
  drop_steps(drop);
}

// Drops compute steps whose outputs nothing reads. Random steps stay: skipping one would
// shift the numbers every later one draws. Collectives stay: the other ranks make them too.
void Plan::eliminate_dead_steps() {
  const std::vector<Buffer>& bufs = rec_->buffers;
  std::vector<char> needed(bufs.size(), 0);
  for (size_t b = 0; b < bufs.size(); ++b)
    needed[b] = escape_[b] >= 0 || bufs[b].kind != BufKind::Temp;
  std::vector<char> drop(all_.size(), 1);
  for (int t = static_cast<int>(all_.size()) - 1; t >= 0; --t) {
    const Step& s = all_[t];
    bool k = op_draws_random(s.op) || op_collective(s.op);
    for (size_t i = 0; i < s.in.size(); ++i)
      if (op_writes_input(s.op, i)) k |= needed[s.in[i].buf] != 0;
    for (const Operand& o : s.out) k |= needed[o.buf] != 0;
    if (!k) continue;
    drop[t] = 0;
    for (const Operand& o : s.in) needed[o.buf] = 1;
  }
  drop_steps(drop);
}

void Plan::reorder_phases(absl::FunctionRef<std::vector<int>(int begin, int end)> order) {
  std::vector<Step> steps;
  steps.reserve(all_.size());
  int n_forward = 0;
  for (const Phase phase : {Phase::Forward, Phase::Backward}) {
    const int begin = phase == Phase::Forward ? 0 : n_forward_;
    const int end = phase == Phase::Forward ? n_forward_ : static_cast<int>(all_.size());
    for (int t : order(begin, end)) steps.push_back(std::move(all_[t]));
    if (phase == Phase::Forward) n_forward = static_cast<int>(steps.size());
  }
  all_ = std::move(steps);
  n_forward_ = n_forward;
}

std::vector<int> Plan::storage_ids() const {
  const std::vector<Buffer>& bufs = rec_->buffers;
  // Bound tensors (arguments, parameters, externals, entry .grads) may be views of one storage
  // at different offsets: different buffers over shared memory. A temporary is its own storage.
  std::vector<int> id(bufs.size());
  absl::flat_hash_map<const Storage*, int> first_of;
  for (size_t b = 0; b < bufs.size(); ++b) {
    const Tensor& t =
        bufs[b].kind == BufKind::GradSlot ? rec_->leaves[bufs[b].index].entry_grad : bufs[b].bound;
    id[b] = t.defined()
                ? first_of.try_emplace(t.impl()->storage.get(), static_cast<int>(b)).first->second
                : static_cast<int>(b);
  }
  return id;
}

// zero_grad(set_to_none = false) before a backward records, for each gradient's first
// contribution c, fill_(g, 0) then add_(g, c): the pair becomes one add_scalar(c, 0) written into
// g, which saves a pass over g. 0 + c and c + 0 are the same IEEE sum for every c: -0.0 becomes
// +0.0 either way (a copy of c would keep -0.0, so a copy is not eager's bits), and a NaN stays
// c's. Only when nothing touches g's storage between the two, and c is not g's storage.
void Plan::fold_zero_fills() {
  const std::vector<int> memory = storage_ids();
  const int n = static_cast<int>(all_.size());
  std::vector<int> fill(memory.size(), -1);  // per storage: a zero fill_ nothing has touched since
  std::vector<char> drop(n, 0);
  for (int t = 0; t < n; ++t) {
    if (t == n_forward_) std::fill(fill.begin(), fill.end(), -1);  // steps stay in their phase
    Step& s = all_[t];
    if (s.op == Op::AddInplace) {
      const Operand g = s.in[0], c = s.in[1];
      const int f = fill[memory[g.buf]];
      if (f >= 0 && all_[f].in[0].buf == g.buf && all_[f].in[0].shape == g.shape &&
          all_[f].in[0].dtype == g.dtype && c.shape == g.shape && c.dtype == g.dtype &&
          memory[c.buf] != memory[g.buf]) {
        drop[f] = 1;
        if (s.index >= 0) folded_fill_[s.index] = all_[f].index;
        s.op = Op::AddScalar;
        s.attrs = AttrBlob::of(ScalarAttrs{0.0});
        s.in = {c};
        s.out = {g};
      }
    }
    for (const Operand& o : s.in) fill[memory[o.buf]] = -1;
    for (const Operand& o : s.out) fill[memory[o.buf]] = -1;
    if (s.op == Op::Fill) {
      const double v = s.attrs.as<ScalarAttrs>().value;
      if (v == 0 && !std::signbit(v)) fill[memory[s.in[0].buf]] = t;
    }
  }
  drop_steps(drop);
}

// copy_(dst, f(...)) as one step: f's step writes dst, and the copy and f's temporary are gone
// (gradient clipping's scale, an average updated in place). f is an elementwise step or where, or
// a fused one without row ops whose last instruction writes its one output, and the copy follows
// it directly (nothing between them sees dst change earlier; f never throws). dst has f's
// output's shape and dtype, and f reads it, if at all, element for element: the kernels of these
// steps read each element of a full-size operand before they write that element of the output
// (kernels/cpu/fused.cc and kernels/cuda/fused_source.cc say so for the fused ones). dst keeps its
// recorded `mutated`, so a CUDA graph still reads an argument written so where it is. In the
// backward only a temporary dst is written so: the backward holds the bound tensors it reads, and
// the copy's destination would no longer be one it reads. A step a rewrite made (its note in the
// dump) is left as it is.
void Plan::fold_copies() {
  const std::vector<Buffer>& bufs = rec_->buffers;
  const std::vector<int> memory = storage_ids();
  const int n = static_cast<int>(all_.size());
  std::vector<int> readers(bufs.size(), 0);
  for (const Step& s : all_)
    for (const Operand& o : s.in) readers[o.buf] += 1;
  auto writes_last = [](const Step& f) {
    if (f.op != Op::FusedElementwise) return op_fusable(f.op);
    const FusedProgram& p = *f.attrs.as<FusedAttrs>().program;
    return !p.row_ops && p.n_out == 1 &&
           p.out_instr[0].instr == static_cast<int>(p.instrs.size()) - 1;
  };
  std::vector<char> drop(n, 0);
  for (int t = 1; t < n; ++t) {
    Step& copy = all_[t];
    Step& f = all_[t - 1];
    if (copy.op != Op::CopyInplace || t == n_forward_ || f.out.size() != 1 || !writes_last(f))
      continue;
    const Operand dst = copy.in[0], src = copy.in[1];
    const Operand& out = f.out[0];
    if (out.buf != src.buf || !(out.shape == dst.shape) || out.dtype != dst.dtype ||
        !(src.shape == dst.shape) || src.dtype != dst.dtype ||
        bufs[src.buf].kind != BufKind::Temp || escape_[src.buf] >= 0 || readers[src.buf] != 1 ||
        bufs[dst.buf].kind == BufKind::GradIn ||
        (t >= n_forward_ && bufs[dst.buf].kind != BufKind::Temp) ||
        rewrite_notes_.contains(src.buf))
      continue;
    bool element_for_element = true;
    for (size_t k = 0; k < f.in.size(); ++k) {
      const Operand& i = f.in[k];
      if (memory[i.buf] != memory[dst.buf]) continue;
      const bool same = i.buf == dst.buf && i.shape == dst.shape && i.dtype == dst.dtype;
      const bool full = f.op != Op::FusedElementwise ||
                        f.attrs.as<FusedAttrs>().program->in_layout[k] == FusedLayout::Full;
      element_for_element = element_for_element && same && full;
    }
    if (!element_for_element) continue;
    f.out[0] = dst;
    f.folded_copy = copy.index;
    drop[t] = 1;
  }
  drop_steps(drop);
}

void Plan::drop_steps(const std::vector<char>& drop) {
  std::vector<Step> kept;
  int n_forward = 0;
  for (int t = 0; t < static_cast<int>(all_.size()); ++t) {
    if (drop[t]) continue;
    if (t < n_forward_) ++n_forward;
    kept.push_back(std::move(all_[t]));
  }
  all_ = std::move(kept);
  n_forward_ = n_forward;
}

int64_t Plan::block_bytes(size_t nbytes) const {
  const int64_t guard = options_.redzones ? kRedzoneBytes : 0;
  return arena_aligned(static_cast<size_t>(arena_aligned(nbytes, align_) + guard), align_);
}

void Plan::plan_memory() {
  const std::vector<Buffer>& bufs = rec_->buffers;
  const int nb = static_cast<int>(bufs.size());
  auto arena = [&](int b) { return bufs[b].kind == BufKind::Temp && escape_[b] < 0; };
  std::vector<int> first(nb, INT_MAX), last(nb, -1);
  for (int t = 0; t < static_cast<int>(all_.size()); ++t) {
    for (const Operand& o : all_[t].in) last[o.buf] = std::max(last[o.buf], t);
    for (const Operand& o : all_[t].out) {
      first[o.buf] = std::min(first[o.buf], t);
      last[o.buf] = std::max(last[o.buf], t);
    }
    if (op_kind(all_[t].op) == OpKind::Inplace)
      for (const Operand& o : all_[t].in) first[o.buf] = std::min(first[o.buf], t);
  }
  root_.resize(nb);
  for (int b = 0; b < nb; ++b) root_[b] = b;
  // The naive sum gives every buffer a block of its own, in place or not.
  const int64_t guard = options_.redzones ? kRedzoneBytes : 0;
  for (int b = 0; b < nb; ++b)
    if (arena(b) && first[b] != INT_MAX) memory_.naive_bytes += block_bytes(bufs[b].nbytes);

  // In place: an elementwise step's fresh output takes the block of an input dying there.
  for (int t = 0; t < static_cast<int>(all_.size()); ++t) {
    const Step& s = all_[t];
    if (!op_elementwise(s.op) || s.out.size() != 1) continue;
    const Operand& o = s.out[0];
    if (!arena(o.buf) || first[o.buf] != t || o.nbytes() != bufs[o.buf].nbytes) continue;
    for (const Operand& i : s.in) {
      const int r = root_[i.buf];
      if (!arena(i.buf) || last[r] != t || i.buf == o.buf || i.dtype != o.dtype ||
          !(i.shape == o.shape) || bufs[r].nbytes != bufs[o.buf].nbytes)
        continue;
      root_[o.buf] = r;
      last[r] = std::max(last[r], last[o.buf]);
      ++memory_.in_place_steps;
      break;
    }
  }

  // Blocks: one per in-place root, with its red zone after it.
  std::vector<Interval> blocks;
  std::vector<int> block_buf;
  for (int b = 0; b < nb; ++b)
    if (arena(b) && root_[b] == b && first[b] != INT_MAX) {
      blocks.push_back({block_bytes(bufs[b].nbytes), first[b], last[b]});
      block_buf.push_back(b);
    }
  const Placement placed = place_intervals(blocks);
  offset_.assign(nb, -1);
  for (size_t k = 0; k < blocks.size(); ++k) offset_[block_buf[k]] = placed.offsets[k];
  memory_.arena_bytes = placed.memory.arena_bytes;
  memory_.lower_bound_bytes = placed.memory.lower_bound_bytes;
  memory_.redzone_bytes = guard;
}

int Plan::in_place_input(const Step& s, int out) const {
  const Operand& o = s.out[out];
  const int r = root_[o.buf];
  if (r == o.buf || offset_[r] < 0) return -1;
  for (size_t i = 0; i < s.in.size(); ++i)
    if (root_[s.in[i].buf] == r) return static_cast<int>(i);
  return -1;
}

}  // namespace encore::schedule
