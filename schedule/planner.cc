#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>

#include "runtime/allocator.h"
#include "runtime/fused.h"
#include "runtime/profiler.h"
#include "runtime/rng.h"
#include "schedule/plan.h"

namespace encore::schedule {
namespace {

constexpr int64_t kAlign = 64;
// Graphs kept per arena and phase: addresses alternate when a caller keeps the previous call's
// outputs while making the next call (y = f(x) in a loop), so two or three sets are common.
constexpr size_t kMaxGraphsPerPhase = 4;
// Escaping storages kept per escape slot and arena (CUDA).
constexpr size_t kEscapePool = 4;

int64_t aligned(size_t n) {
  return (static_cast<int64_t>(n) + kAlign - 1) / kAlign * kAlign;
}

// Ops whose output element i depends only on element i of inputs of the output's shape, so
// the output may overwrite such an input.
bool elementwise(Op op) {
  return op == Op::Copy || fusable_op(op);
}

// Elementwise ops that broadcast an operand (here: one of a single element).
bool broadcasting(Op op) {
  return op == Op::Add || op == Op::Sub || op == Op::Mul || op == Op::Div;
}

// Fusable ops reading two tensors.
bool reads_two(Op op) {
  switch (op) {
    case Op::ReluGrad:
    case Op::LeakyReluGrad:
    case Op::SigmoidGrad:
    case Op::TanhGrad:
      return true;
    default:
      return broadcasting(op);
  }
}

// The step times of one profiled replay loop, handed to the profiler once the loop ends.
std::vector<profiler::StepTime>& step_times() {
  thread_local std::vector<profiler::StepTime> times;
  return times;
}

Device device_of(const Step& s, const Recording& rec) {
  const Operand& o = s.in.empty() ? s.out[0] : s.in[0];
  return rec.buffers[o.buf].device;
}

}  // namespace

Plan::Plan(std::shared_ptr<Recording> rec, bool fuse) : rec_(std::move(rec)) {
  n_forward_ = static_cast<int>(rec_->forward.size());
  all_ = std::move(rec_->forward);
  for (Step& s : rec_->backward) all_.push_back(std::move(s));
  for (size_t t = 0; t < all_.size(); ++t) all_[t].index = static_cast<int>(t);
  trace_steps_ = all_;
  recorded_forward_ = n_forward_;
  rec_->forward.clear();
  rec_->backward.clear();
  results_ = rec_->results;
  for (const Recording::Contribution& c : rec_->contributions) grads_.push_back(c.grad);
  add_copies();
  eliminate_dead_steps();
  device_ = all_.empty() ? Device::cpu() : device_of(all_[0], *rec_);
  if (device_.type == DeviceType::CPU && fuse) fuse_elementwise();
  plan_memory();
  build_steps();
  if (device_.type == DeviceType::CUDA) plan_graphs();
}

Plan::~Plan() {
  for (auto& b : states_)
    if (b->arena != nullptr) allocator_for(device_).deallocate(b->arena, memory_.arena_bytes);
}

// What a CUDA graph of each phase reads from staging copies, and where random steps find their
// {seed, offset}.
void Plan::plan_graphs() {
  const std::vector<Buffer>& bufs = rec_->buffers;
  stage_slot_.assign(bufs.size(), -1);
  for (int buf : external_) {
    const Buffer& b = bufs[buf];
    // An argument written in place must be the caller's own buffer: it is keyed, not staged.
    if ((b.kind == BufKind::Arg && !b.mutated) || b.kind == BufKind::GradIn)
      stage_slot_[buf] = static_cast<int>(stage_slots_++);
  }
  // A buffer both phases read is staged once, by the forward (the backward holds the block),
  // unless the forward ran on the stream.
  std::vector<char> read(bufs.size(), 0);  // bit 0: by the forward, bit 1: by the backward
  for (size_t k = 0; k < patches_.size(); ++k) {
    const auto& [vi, buf] = patches_[k];
    const Phase phase = k >= forward_patches_ ? Phase::Backward : Phase::Forward;
    read[buf] |= phase == Phase::Backward ? 2 : 1;
    if (stage_slot_[buf] >= 0) staged_views_[phase].emplace_back(vi, stage_slot_[buf]);
  }
  for (size_t buf = 0; buf < bufs.size(); ++buf) {
    if (stage_slot_[buf] < 0) continue;
    if (read[buf] & 1) staged_.forward.push_back(static_cast<int>(buf));
    if (read[buf] == 2) staged_.backward.push_back(static_cast<int>(buf));
    if (read[buf] == 3) staged_both_.push_back(static_cast<int>(buf));
  }
  for (int i = 0; i < static_cast<int>(steps_.size()); ++i) {
    if (!steps_[i].random) continue;
    random_steps_.push_back(i);
    if (i < n_forward_) random_forward_ = random_steps_.size();
  }
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
    Buffer b;
    b.kind = BufKind::Temp;
    b.nbytes = like.nbytes();
    b.device = bufs[like.buf].device;
    bufs.push_back(std::move(b));
    escape_.push_back(-1);
    written_fwd.push_back(0);
    written_bwd.push_back(0);
    return static_cast<int>(bufs.size()) - 1;
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

// Drops compute steps whose outputs nothing reads. Random steps stay: skipping one would
// shift the numbers every later one draws.
void Plan::eliminate_dead_steps() {
  const std::vector<Buffer>& bufs = rec_->buffers;
  std::vector<char> needed(bufs.size(), 0);
  for (size_t b = 0; b < bufs.size(); ++b)
    needed[b] = escape_[b] >= 0 || bufs[b].kind != BufKind::Temp;
  std::vector<char> keep(all_.size(), 0);
  for (int t = static_cast<int>(all_.size()) - 1; t >= 0; --t) {
    const Step& s = all_[t];
    bool k = op_draws_random(s.op);
    const uint8_t mutates = op_mutated_inputs(s.op);
    for (size_t i = 0; i < s.in.size(); ++i)
      if (mask_bit(mutates, i)) k |= needed[s.in[i].buf] != 0;
    for (const Operand& o : s.out) k |= needed[o.buf] != 0;
    if (!k) continue;
    keep[t] = 1;
    for (const Operand& o : s.in) needed[o.buf] = 1;
  }
  std::vector<Step> kept;
  int n_forward = 0;
  for (size_t t = 0; t < all_.size(); ++t) {
    if (!keep[t]) continue;
    if (static_cast<int>(t) < n_forward_) ++n_forward;
    kept.push_back(std::move(all_[t]));
  }
  all_ = std::move(kept);
  n_forward_ = n_forward;
}

// Runs of adjacent elementwise steps of one phase, dtype and element count become one
// FusedElementwise step (cpu plans). Its kernel runs the steps block by block: a value only
// the run reads lives in a scratch block (never in the arena), and one the rest of the
// schedule reads (a saved activation, a result, a gradient) is an output of the fused step.
void Plan::fuse_elementwise() {
  const std::vector<Buffer>& bufs = rec_->buffers;
  const int n = static_cast<int>(all_.size());
  std::vector<int> last_read(bufs.size(), -1);
  for (int t = 0; t < n; ++t)
    for (const Operand& o : all_[t].in) last_read[o.buf] = t;
  // Whether `s` can join a run over `numel` elements of `dtype`.
  auto joins = [&](const Step& s, DType dtype, int64_t numel) {
    if (!fusable_op(s.op) || s.out.size() != 1) return false;
    const Operand& o = s.out[0];
    if (o.dtype != dtype || o.shape.numel() != numel || bufs[o.buf].kind != BufKind::Temp)
      return false;
    for (const Operand& i : s.in) {
      const int64_t k = i.shape.numel();
      if (i.dtype != dtype || (k != numel && !(k == 1 && broadcasting(s.op)))) return false;
    }
    return true;
  };

  // A buffer read with the run's element count and one read as a broadcast single element are
  // two inputs (two arguments may alias one buffer with different shapes): reg and last_in are
  // per read, indexed by read_key.
  auto read_key = [](const Operand& o, int64_t numel) {
    return 2 * o.buf + (o.shape.numel() == 1 && numel > 1);
  };
  std::vector<int> group_of(bufs.size(), -1);     // per buffer: the run producing it (its start)
  std::vector<int> reg(2 * bufs.size(), -1);      // per read: its register in the current run
  std::vector<int> last_in(2 * bufs.size(), -1);  // per read: its last inside the run
  std::vector<Step> steps;
  int n_forward = 0;
  for (int t = 0; t < n;) {
    const Step& first = all_[t];
    const int phase_end = t < n_forward_ ? n_forward_ : n;
    int e = t;
    if (!first.out.empty() &&
        (first.out[0].dtype == DType::Float32 || first.out[0].dtype == DType::Float64)) {
      const DType dtype = first.out[0].dtype;
      const int64_t numel = first.out[0].shape.numel();
      int inputs = 0;
      while (e < phase_end && e - t < FusedProgram::kMaxSteps && joins(all_[e], dtype, numel)) {
        int fresh = 0;  // inputs the run does not read yet (one counted twice at worst)
        for (const Operand& i : all_[e].in)
          fresh += group_of[i.buf] != t && last_in[read_key(i, numel)] < t;
        if (inputs + fresh > FusedProgram::kMaxInputs) break;
        for (const Operand& i : all_[e].in) {
          if (group_of[i.buf] != t && last_in[read_key(i, numel)] < t) ++inputs;
          last_in[read_key(i, numel)] = e;
        }
        group_of[all_[e].out[0].buf] = t;
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
    p.dtype = all_[t].out[0].dtype;
    p.numel = all_[t].out[0].shape.numel();
    Step fused{Op::FusedElementwise, AttrBlob::of(FusedAttrs{program.get()}), -1, {}, {}};
    // Inputs in order of first read; then which produced values leave the run (outputs) and
    // which live in scratch slots, reused once their last reader inside the run has read them.
    // A value the run produces has its element count: its read key is 2 * buffer.
    std::vector<int> touched;
    for (int j = t; j < e; ++j)
      for (const Operand& i : all_[j].in)
        if (const int k = read_key(i, p.numel); group_of[i.buf] != t && reg[k] < 0) {
          if (k % 2) p.broadcast |= uint64_t{1} << p.n_in;
          reg[k] = p.n_in++;
          touched.push_back(k);
          fused.in.push_back(i);
        }
    auto scratch_slot = [&](int b) {  // the scratch slot holding b, or -1
      const int k = reg[2 * b] - p.n_in;
      return group_of[b] == t && k >= 0 && k < FusedProgram::kMaxScratch ? k : -1;
    };
    bool used[FusedProgram::kMaxScratch] = {};
    for (int j = t; j < e; ++j) {
      const Step& s = all_[j];
      for (const Operand& i : s.in)  // a value read for the last time frees its slot
        if (const int k = scratch_slot(i.buf); k >= 0 && last_in[2 * i.buf] == j) used[k] = false;
      const int b = s.out[0].buf;
      touched.push_back(2 * b);
      int free_slot = -1;
      if (escape_[b] < 0 && last_read[b] < e && last_in[2 * b] >= 0)
        for (int k = 0; k < FusedProgram::kMaxScratch && free_slot < 0; ++k)
          if (!used[k]) free_slot = k;
      if (free_slot >= 0) {
        used[free_slot] = true;
        reg[2 * b] = p.scratch_reg(free_slot);
        p.n_scratch = std::max(p.n_scratch, free_slot + 1);
      } else {  // read after the run, or no slot free
        reg[2 * b] = p.out_reg(p.n_out++);
        p.out_instr.push_back(j - t);
        fused.out.push_back(s.out[0]);
      }
    }
    for (int j = t; j < e; ++j) {
      const Step& s = all_[j];
      FusedInstr ins;
      ins.op = s.op;
      ins.out = static_cast<uint8_t>(reg[2 * s.out[0].buf]);
      ins.a = static_cast<uint8_t>(reg[read_key(s.in[0], p.numel)]);
      ins.b = s.in.size() > 1 ? static_cast<uint8_t>(reg[read_key(s.in[1], p.numel)]) : ins.a;
      if (op_has_scalar_attrs(s.op)) ins.scalar = s.attrs.as<ScalarAttrs>().value;
      p.instrs.push_back(ins);
      p.trace_index.push_back(s.index);
    }
    for (int k : touched) reg[k] = -1;
    programs_.push_back(std::move(program));
    steps.push_back(std::move(fused));
    t = e;
  }
  all_ = std::move(steps);
  n_forward_ = n_forward;
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
  for (int b = 0; b < nb; ++b)
    if (arena(b) && first[b] != INT_MAX) memory_.naive_bytes += aligned(bufs[b].nbytes);

  // In place: an elementwise step's fresh output takes the block of an input dying there.
  for (int t = 0; t < static_cast<int>(all_.size()); ++t) {
    const Step& s = all_[t];
    if (!elementwise(s.op) || s.out.size() != 1) continue;
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

  // Lower bound: the most bytes alive at one step.
  struct Interval {
    int buf, first, last;
    int64_t size;
  };
  std::vector<Interval> roots;
  for (int b = 0; b < nb; ++b)
    if (arena(b) && root_[b] == b && first[b] != INT_MAX)
      roots.push_back({b, first[b], last[b], aligned(bufs[b].nbytes)});
  std::vector<int64_t> alive(all_.size() + 1, 0);
  for (const Interval& iv : roots) {
    alive[iv.first] += iv.size;
    alive[iv.last + 1] -= iv.size;
  }
  int64_t running = 0;
  for (int64_t a : alive) {
    running += a;
    memory_.lower_bound_bytes = std::max(memory_.lower_bound_bytes, running);
  }

  // Best fit, largest first: each block goes into the smallest gap between the blocks already
  // placed that are alive at the same time, or above them all.
  std::stable_sort(roots.begin(), roots.end(),
                   [](const Interval& a, const Interval& b) { return a.size > b.size; });
  offset_.assign(nb, -1);
  struct Placed {
    int64_t offset, size;
    int first, last;
  };
  std::vector<Placed> placed;
  std::vector<const Placed*> overlapping;
  for (const Interval& iv : roots) {
    overlapping.clear();
    for (const Placed& p : placed)
      if (p.first <= iv.last && iv.first <= p.last) overlapping.push_back(&p);
    std::sort(overlapping.begin(), overlapping.end(),
              [](const Placed* a, const Placed* b) { return a->offset < b->offset; });
    int64_t best = -1, best_gap = INT64_MAX, end = 0;
    for (const Placed* p : overlapping) {
      const int64_t gap = p->offset - end;
      if (gap >= iv.size && gap < best_gap) {
        best = end;
        best_gap = gap;
      }
      end = std::max(end, p->offset + p->size);
    }
    if (best < 0) best = end;
    offset_[iv.buf] = best;
    placed.push_back({best, iv.size, iv.first, iv.last});
    memory_.arena_bytes = std::max(memory_.arena_bytes, best + iv.size);
  }
}

void Plan::build_steps() {
  const std::vector<Buffer>& bufs = rec_->buffers;
  std::vector<char> external(bufs.size(), 0), bwd_read(bufs.size(), 0);
  for (int t = 0; t < static_cast<int>(all_.size()); ++t) {
    if (t == n_forward_) forward_patches_ = patches_.size();
    const Step& s = all_[t];
    ExecStep e;
    e.op = s.op;
    e.trace_index = s.index;
    e.fn = lookup_kernel(s.op, device_.type);
    e.attrs = s.attrs;
    e.view = static_cast<uint32_t>(view_template_.size());
    e.n_in = static_cast<uint8_t>(s.in.size());
    e.n_out = static_cast<uint8_t>(s.out.size());
    e.random = op_draws_random(s.op);
    if (e.random) e.random_count = random_count(s.in[0].shape.numel());
    auto add_view = [&](const Operand& o, bool read) {
      const uint32_t vi = static_cast<uint32_t>(view_template_.size());
      view_template_.push_back(BufferView{nullptr, o.shape, o.dtype});
      const int r = root_[o.buf];
      if (offset_[r] >= 0) {
        arena_views_.emplace_back(vi, offset_[r]);
      } else {
        patches_.emplace_back(vi, o.buf);
        external[o.buf] = 1;
        if (read && t >= n_forward_) bwd_read[o.buf] = 1;
      }
    };
    for (const Operand& o : s.in) add_view(o, true);
    for (const Operand& o : s.out) add_view(o, false);
    steps_.push_back(e);
  }
  if (n_forward_ == static_cast<int>(all_.size())) forward_patches_ = patches_.size();
  for (const Operand& r : results_) external[r.buf] = 1;
  std::vector<char> seen(bufs.size(), 0);
  for (int t = 0; t < static_cast<int>(all_.size()); ++t)
    for (const Operand& o : all_[t].out)
      if (escape_[o.buf] >= 0 && !seen[o.buf]) {
        seen[o.buf] = 1;
        (t < n_forward_ ? fwd_escapes_ : bwd_escapes_).push_back(o.buf);
      }
  for (size_t b = 0; b < bufs.size(); ++b) {
    if (!external[b]) continue;
    external_.push_back(static_cast<int>(b));
    if (bufs[b].mutated && bufs[b].kind != BufKind::Temp)
      mutated_external_.push_back(static_cast<int>(b));
    const bool per_call = bufs[b].kind == BufKind::Arg || bufs[b].kind == BufKind::Param ||
                          bufs[b].kind == BufKind::GradSlot;
    if (bwd_read[b] && per_call) backward_reads_.push_back(static_cast<int>(b));
  }
}

CallState* Plan::acquire() {
  {
    std::lock_guard<std::mutex> l(pool_mu_);
    if (!free_.empty()) {
      CallState* b = free_.back();
      free_.pop_back();
      return b;
    }
  }
  auto b = std::make_unique<CallState>();
  if (memory_.arena_bytes > 0)
    b->arena = allocator_for(device_).allocate(static_cast<size_t>(memory_.arena_bytes));
  b->views = view_template_;
  for (const auto& [vi, off] : arena_views_) b->views[vi].data = static_cast<char*>(b->arena) + off;
  b->ptrs.assign(rec_->buffers.size(), nullptr);
  b->own.resize(escapes_);
  b->held.reserve(backward_reads_.size());
  b->versions.reserve(backward_reads_.size());
  if (device_.type == DeviceType::CUDA) {
    b->escape_pool.resize(escapes_);
    b->escape_fixed.resize(escapes_);
    b->staging.resize(stage_slots_);
  }
  CallState* out = b.get();
  std::lock_guard<std::mutex> l(pool_mu_);
  states_.push_back(std::move(b));
  return out;
}

void Plan::release(CallState* b) {
  b->held.clear();
  b->versions.clear();
  for (auto& s : b->own) s.reset();
  b->backward_done = false;
  b->forward_staged = false;
  std::lock_guard<std::mutex> l(pool_mu_);
  free_.push_back(b);
}

int Plan::arenas() const {
  std::lock_guard<std::mutex> l(pool_mu_);
  return static_cast<int>(states_.size());
}

GraphStats Plan::graph_stats() const {
  GraphStats s;
  s.launches = graph_launches_.load(std::memory_order_relaxed);
  s.captures = graph_captures_.load(std::memory_order_relaxed);
  s.stream_replays = stream_replays_.load(std::memory_order_relaxed);
  if (graphs_off_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> l(fallback_mu_);
    s.fallback = fallback_;
  }
  return s;
}

void Plan::allocate_escapes(CallState& b, Phase phase) {
  const Recording& rec = *rec_;
  const bool cuda = device_.type == DeviceType::CUDA;
  for (int buf : phase == Phase::Backward ? bwd_escapes_ : fwd_escapes_) {
    const int slot = escape_[buf];
    const size_t nbytes = rec.buffers[buf].nbytes;
    IntrusivePtr<Storage>& s = b.own[slot];
    s.reset();
    if (!cuda) {
      s = make_intrusive<Storage>(nbytes, device_);
      b.ptrs[buf] = s->data();
      continue;
    }
    // On CUDA the addresses should repeat, so a captured graph stays valid: a kept storage only
    // this plan holds is free to overwrite; one the caller still holds is left alone (its output
    // stays valid) and a new one joins the pool. With the pool full of held outputs (a caller
    // keeping every loss), the steps write a fixed buffer that is copied into new storage.
    std::vector<IntrusivePtr<Storage>>& pool = b.escape_pool[slot];
    for (const IntrusivePtr<Storage>& kept : pool)
      if (kept->use_count() == 1) {
        s = kept;
        break;
      }
    if (!s && pool.size() < kEscapePool) {
      s = make_intrusive<Storage>(nbytes, device_);
      pool.push_back(s);
    }
    if (s) {
      b.ptrs[buf] = s->data();
      continue;
    }
    s = make_intrusive<Storage>(nbytes, device_);
    IntrusivePtr<Storage>& fixed = b.escape_fixed[slot];
    if (!fixed) fixed = make_intrusive<Storage>(nbytes, device_);
    b.ptrs[buf] = fixed->data();
    b.copy_out.emplace_back(buf, slot);
  }
}

void Plan::finish_copy_out(CallState& b) {
  for (const auto& [buf, slot] : b.copy_out)
    cuda::copy_bytes(b.own[slot]->data(), device_, b.escape_fixed[slot]->data(), device_,
                     rec_->buffers[buf].nbytes);
  b.copy_out.clear();
}

void Plan::bind(CallState& b, Phase phase) const {
  const auto [p0, p1] = patch_range(phase);
  for (size_t k = p0; k < p1; ++k) b.views[patches_[k].first].data = b.ptrs[patches_[k].second];
}

void Plan::run(CallState& b, Phase phase, std::vector<StepSnapshot>* snapshots) {
  const bool backward = phase == Phase::Backward;
  const int begin = backward ? n_forward_ : 0;
  const int end = backward ? static_cast<int>(steps_.size()) : n_forward_;
  if (device_.type == DeviceType::CUDA) {
    cuda::set_device(device_.index);
    if (begin < end && snapshots == nullptr && !profiler::active() &&
        !graphs_off_.load(std::memory_order_acquire) && cuda::graphs_enabled()) {
      run_graph(b, phase, begin, end);
      finish_copy_out(b);
      return;
    }
    stream_replays_.fetch_add(1, std::memory_order_relaxed);
    if (!backward) b.forward_staged = false;
  }
  if (profiler::active()) [[unlikely]]
    run_steps<true>(b, begin, end, snapshots);
  else
    run_steps<false>(b, begin, end, snapshots);
  finish_copy_out(b);  // (only CUDA escapes are ever copied out)
}

void Plan::run_graph(CallState& b, Phase phase, int begin, int end) {
  const bool backward = phase == Phase::Backward;
  const cuda::StreamHandle stream = cuda::current_stream(device_.index);
  const std::vector<Buffer>& bufs = rec_->buffers;

  // Arguments and incoming gradients: copied into the block's staging buffers, which the
  // graph reads (an address of the caller's changes every call).
  auto stage = [&](const std::vector<int>& list) {
    for (int buf : list) {
      IntrusivePtr<Storage>& st = b.staging[stage_slot_[buf]];
      if (!st) st = make_intrusive<Storage>(bufs[buf].nbytes, device_);
      cuda::copy_bytes(st->data(), device_, b.ptrs[buf], device_, bufs[buf].nbytes);
    }
  };
  stage(staged_[phase]);
  if (backward && !b.forward_staged) stage(staged_both_);
  if (!backward) b.forward_staged = true;
  for (const auto& [vi, slot] : staged_views_[phase]) b.views[vi].data = b.staging[slot]->data();

  // Random steps: fresh {seed, offset} pairs, reserved in step order as a replay on the host
  // reserves them, written where the captured kernels read them.
  const size_t r0 = backward ? random_forward_ : 0;
  const size_t r1 = backward ? random_steps_.size() : random_forward_;
  if (r1 > r0) {
    if (!b.random_state) {
      b.random_state =
          make_intrusive<Storage>(random_steps_.size() * 2 * sizeof(uint64_t), device_);
      b.random_host.assign(random_steps_.size() * 2, 0);
    }
    for (size_t r = r0; r < r1; ++r) {
      const Generator::Stream st =
          default_generator(device_).reserve(steps_[random_steps_[r]].random_count);
      b.random_host[2 * r] = st.seed;
      b.random_host[2 * r + 1] = st.offset;
    }
    // From pageable memory: the bytes are taken before the call returns.
    cuda::copy_bytes(static_cast<uint64_t*>(b.random_state->data()) + 2 * r0, device_,
                     b.random_host.data() + 2 * r0, Device::cpu(), (r1 - r0) * 2 * sizeof(uint64_t),
                     /*non_blocking=*/true);
  }

  // The graph for these addresses, or a new capture.
  const auto [p0, p1] = patch_range(phase);
  std::vector<CapturedGraph>& graphs = b.graphs[phase];
  for (CapturedGraph& g : graphs) {
    bool same = true;
    for (size_t k = p0; k < p1 && same; ++k)
      same = g.key[k - p0] == b.views[patches_[k].first].data;
    if (!same) continue;
    g.last_use = graph_clock_.fetch_add(1, std::memory_order_relaxed) + 1;
    g.graph.launch(stream);
    graph_launches_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // Captured on this thread's own capture stream (no other thread puts work there), then
  // launched on the current stream.
  CapturedGraph fresh;
  for (size_t k = p0; k < p1; ++k) fresh.key.push_back(b.views[patches_[k].first].data);
  std::string failure;
  try {
    const cuda::StreamHandle side = cuda::capture_stream(device_.index);
    const cuda::StreamGuard on_side(device_.index, side);
    fresh.graph.begin_capture(side);
    run_steps<false>(b, begin, end, nullptr, /*device_random=*/true);
    if (!fresh.graph.end_capture()) failure = fresh.graph.failure();
  } catch (const std::exception& e) {
    fresh.graph.abort_capture();
    failure = e.what();
  }
  if (!failure.empty()) {
    // Capture is impossible for this schedule: replay it on the stream from now on.
    {
      std::lock_guard<std::mutex> l(fallback_mu_);
      if (!graphs_off_.load(std::memory_order_relaxed))
        fallback_ = cat(phase_name(phase), " capture failed: ", failure);
      graphs_off_.store(true, std::memory_order_release);
    }
    graphs.clear();
    stream_replays_.fetch_add(1, std::memory_order_relaxed);
    run_steps<false>(b, begin, end, nullptr, /*device_random=*/true);
    return;
  }
  graph_captures_.fetch_add(1, std::memory_order_relaxed);
  fresh.last_use = graph_clock_.fetch_add(1, std::memory_order_relaxed) + 1;
  CapturedGraph* g = nullptr;
  if (graphs.size() < kMaxGraphsPerPhase) {
    g = &graphs.emplace_back(std::move(fresh));
  } else {
    g = &*std::min_element(graphs.begin(), graphs.end(),
                           [](const auto& x, const auto& y) { return x.last_use < y.last_use; });
    *g = std::move(fresh);
  }
  g->graph.launch(stream);
  graph_launches_.fetch_add(1, std::memory_order_relaxed);
}

template <bool kProfile>
void Plan::run_steps(CallState& b, int begin, int end, std::vector<StepSnapshot>* snapshots,
                     bool device_random) {
  const BufferView* v = b.views.data();
  const bool cuda = device_.type == DeviceType::CUDA;
  // device_random runs a whole phase: its random steps use the phase's pairs in order.
  size_t next_random = begin >= n_forward_ ? random_forward_ : 0;
  [[maybe_unused]] cuda::StreamHandle stream = nullptr;
  [[maybe_unused]] bool shapes = false;
  [[maybe_unused]] std::vector<profiler::StepTime>* times = nullptr;
  [[maybe_unused]] int64_t t = 0;  // when the next step starts: the previous one's end
  if constexpr (kProfile) {
    times = &step_times();
    times->clear();
    shapes = profiler::recording_shapes();
    if (shapes) {
      std::call_once(profile_args_once_, [this] {
        profile_args_.reserve(steps_.size());
        for (const ExecStep& s : steps_) {
          const BufferView* sv = view_template_.data() + s.view;
          profile_args_.push_back(
              intern(profiler::shapes_text(std::span<const BufferView>(sv, s.n_in),
                                           std::span<const BufferView>(sv + s.n_in, s.n_out))));
        }
      });
    }
    t = profiler::ticks();
    if (cuda) {
      stream = cuda::current_stream(device_.index);
      b.timeline.clear();
      b.timeline.mark(stream);
    }
  }
  for (int i = begin; i < end; ++i) {
    const ExecStep& s = steps_[i];
    const std::span<const BufferView> in(v + s.view, s.n_in), out(v + s.view + s.n_in, s.n_out);
    if (s.random) [[unlikely]] {
      RandomAttrs a = s.attrs.as<RandomAttrs>();
      if (device_random) {
        a.state_ptr = reinterpret_cast<uint64_t>(static_cast<uint64_t*>(b.random_state->data()) +
                                                 2 * next_random++);
      } else {
        const Generator::Stream st = default_generator(device_).reserve(s.random_count);
        a.seed = st.seed;
        a.offset = st.offset;
      }
      s.fn(KernelArgs{in, out, AttrBlob::of(a)});
    } else {
      s.fn(KernelArgs{in, out, s.attrs});
    }
    if constexpr (kProfile) {
      const int64_t now = profiler::ticks();
      const bool backward = i >= n_forward_;
      times->push_back({s.op, backward, backward ? i - n_forward_ : i,
                        shapes ? profile_args_[i] : std::string_view(), t, now});
      t = now;
      if (cuda) b.timeline.mark(stream);
    }
    if (snapshots != nullptr) {
      // Per recorded step, as the recorder keeps them.
      auto keep = [&](StepSnapshot& snap, const BufferView& bv) {
        const size_t n = static_cast<size_t>(bv.numel()) * itemsize(bv.dtype);
        const size_t at = snap.bytes.size();
        snap.bytes.resize(at + n);
        cuda::copy_bytes(snap.bytes.data() + at, Device::cpu(), bv.data, device_, n);
      };
      if (s.op == Op::FusedElementwise) {
        const FusedProgram& p = *s.attrs.as<FusedAttrs>().program;
        for (int k = 0; k < s.n_out; ++k)
          keep(snapshots->emplace_back(StepSnapshot{p.trace_index[p.out_instr[k]], {}}), out[k]);
      } else {
        StepSnapshot& snap = snapshots->emplace_back(StepSnapshot{s.trace_index, {}});
        for_each_written(s.op, in, out, [&](const BufferView& bv) { keep(snap, bv); });
      }
      if constexpr (kProfile) t = profiler::ticks();  // the copy is not the next step's time
    }
  }
  if constexpr (kProfile) {
    if (cuda) {
      // A step's time is its device time (its launch is only queued), laid end to end from
      // the first launch.
      const std::vector<int64_t> ns = b.timeline.take_intervals_ns();
      int64_t at = times->empty() ? 0 : times->front().start;
      for (size_t k = 0; k < times->size() && k < ns.size(); ++k) {
        (*times)[k].start = at;
        at += profiler::ticks_from_ns(ns[k]);
        (*times)[k].end = at;
      }
    }
    profiler::record_steps(*times);
  }
}

// ---- Schedule dump ---------------------------------------------------------------------

namespace {

std::string named(const std::vector<std::string>& names, int i, std::string_view what) {
  if (i >= 0 && i < static_cast<int>(names.size()) && !names[i].empty())
    return cat(what, " ", i, " '", names[i], "'");
  return cat(what, " ", i);
}

// A fused step's instructions, one per line: "out 1 = tanh(scratch 0)".
std::string fused_text(const FusedProgram& p, const std::string& indent) {
  auto name = [&p](int r) {
    if (r < p.n_in) return cat("in ", r);
    if (r < p.out_reg(0)) return cat("scratch ", r - p.scratch_reg(0));
    return cat("out ", r - p.out_reg(0));
  };
  std::string out;
  for (const FusedInstr& ins : p.instrs) {
    out += cat(indent, name(ins.out), " = ", op_name(ins.op), "(", name(ins.a));
    if (reads_two(ins.op)) out += cat(", ", name(ins.b));
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

int Plan::in_place_input(const Step& s, int out) const {
  const Operand& o = s.out[out];
  const int r = root_[o.buf];
  if (r == o.buf || offset_[r] < 0) return -1;
  for (size_t i = 0; i < s.in.size(); ++i)
    if (root_[s.in[i].buf] == r) return static_cast<int>(i);
  return -1;
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
  if (const int64_t off = arena_offset(buf); off >= 0)
    return cat("arena [", off, ",", off + static_cast<int64_t>(b.nbytes), ")");
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

std::string Plan::steps_text(const Names& names, const std::string& indent) const {
  std::string out;
  char head[160];
  for (int phase = 0; phase < 2; ++phase) {
    const int begin = phase == 0 ? 0 : n_forward_;
    const int end = phase == 0 ? n_forward_ : static_cast<int>(all_.size());
    out += cat(indent, phase == 0 ? "forward" : "backward", ": ", end - begin,
               end - begin == 1 ? " step\n" : " steps\n");
    for (int t = begin; t < end; ++t) {
      const Step& s = all_[t];
      std::string marks = attrs_note(s);
      auto mark = [&marks](std::string_view m) { marks += cat(marks.empty() ? "" : "; ", m); };
      if (op_draws_random(s.op)) mark("random");
      for (size_t k = 0; k < s.out.size(); ++k)
        if (in_place_input(s, static_cast<int>(k)) >= 0) mark("in place");
      const uint8_t mutates = op_mutated_inputs(s.op);
      if (mutates != 0) mark("updates its input in place");
      const FusedProgram* fused =
          s.op == Op::FusedElementwise ? s.attrs.as<FusedAttrs>().program : nullptr;
      if (fused != nullptr)
        mark(cat("fuses ", fused->instrs.size(), " steps, ", fused->n_scratch,
                 fused->n_scratch == 1 ? " scratch block" : " scratch blocks"));
      else if (s.index < 0)
        mark("added by the plan");
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
        operand("in", k, s.in[k], mask_bit(mutates, k) ? "(written in place)" : "");
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
  std::vector<int> home(nb, -1);
  for (int t = 0; t < static_cast<int>(all_.size()); ++t) {
    const int phase = t < n_forward_ ? 0 : 1;
    for (const Operand& o : all_[t].in)
      if (seen[o.buf] == nullptr) seen[o.buf] = &o;
    for (const Operand& o : all_[t].out) {
      if (seen[o.buf] == nullptr) seen[o.buf] = &o;
      if (home[o.buf] < 0 && rec_->buffers[o.buf].kind == BufKind::Temp) home[o.buf] = phase;
    }
  }
  auto buffer_node = [&](int b, const char* indent) {
    return cat(
        indent, prefix, "b", b, " [shape=ellipse, label=",
        dot_quote(cat("b", b, " ", seen[b]->dtype, seen[b]->shape, "\n", location(b, names))),
        "];\n");
  };
  std::string out, edges;
  for (int phase = 0; phase < 2; ++phase) {
    const int begin = phase == 0 ? 0 : n_forward_;
    const int end = phase == 0 ? n_forward_ : static_cast<int>(all_.size());
    const char* what = phase == 0 ? "forward" : "backward";
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
                 ", label=\"", phase == 0 ? "fwd " : "bwd ", t - begin, ": ", op_name(s.op),
                 note.empty() ? "" : "\\n" + note, in_place ? "\\n(in place)" : "",
                 random ? "\\n(random)" : "", "\"];\n");
      const uint8_t mutates = op_mutated_inputs(s.op);
      for (size_t k = 0; k < s.in.size(); ++k) {
        const int b = s.in[k].buf;
        edges += cat("    ", prefix, "b", b, " -> ", prefix, "s", t, ";\n");
        if (mask_bit(mutates, k))
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
    if (seen[b] != nullptr && home[b] < 0) out += buffer_node(b, "    ");
  return out + edges;
}

}  // namespace encore::schedule
