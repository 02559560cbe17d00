#include <algorithm>
#include <climits>
#include <cstring>

#include "runtime/allocator.h"
#include "runtime/rng.h"
#include "schedule/plan.h"

namespace encore::schedule {
namespace {

constexpr int64_t kAlign = 64;

int64_t aligned(size_t n) {
  return (static_cast<int64_t>(n) + kAlign - 1) / kAlign * kAlign;
}

// Ops whose output element i depends only on element i of inputs of the output's shape, so
// the output may overwrite such an input.
bool elementwise(Op op) {
  if (op_has_scalar_attrs(op)) return op != Op::Fill;  // x op s, leaky_relu and its gradient
  switch (op) {
    case Op::Add:
    case Op::Sub:
    case Op::Mul:
    case Op::Div:
    case Op::Neg:
    case Op::Exp:
    case Op::Log:
    case Op::Sqrt:
    case Op::Relu:
    case Op::Sigmoid:
    case Op::Tanh:
    case Op::ReluGrad:
    case Op::SigmoidGrad:
    case Op::TanhGrad:
    case Op::Copy:
      return true;
    default:
      return false;
  }
}

Device device_of(const Step& s, const Recording& rec) {
  const Operand& o = s.in.empty() ? s.out[0] : s.in[0];
  return rec.buffers[o.buf].device;
}

}  // namespace

Plan::Plan(std::shared_ptr<Recording> rec) : rec_(std::move(rec)) {
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
  plan_memory();
  build_steps();
}

Plan::~Plan() {
  for (auto& b : blocks_)
    if (b->arena != nullptr) allocator_for(Device::cpu()).deallocate(b->arena, memory_.arena_bytes);
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
    const uint8_t mutates = op_kind(s.op) == OpKind::Inplace ? op_mutated_inputs(s.op) : 0;
    for (size_t i = 0; i < s.in.size(); ++i)
      if (mutates >> i & 1) k |= needed[s.in[i].buf] != 0;
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
    const Step& s = all_[t];
    ExecStep e;
    e.op = s.op;
    e.trace_index = s.index;
    e.device = device_of(s, *rec_);
    e.fn = lookup_kernel(s.op, e.device.type);
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

Block* Plan::acquire() {
  if (!free_.empty()) {
    Block* b = free_.back();
    free_.pop_back();
    return b;
  }
  auto b = std::make_unique<Block>();
  if (memory_.arena_bytes > 0)
    b->arena = allocator_for(Device::cpu()).allocate(static_cast<size_t>(memory_.arena_bytes));
  b->views = view_template_;
  for (const auto& [vi, off] : arena_views_) b->views[vi].data = static_cast<char*>(b->arena) + off;
  b->ptrs.assign(rec_->buffers.size(), nullptr);
  b->own.resize(escapes_);
  b->held.reserve(backward_reads_.size());
  b->versions.reserve(backward_reads_.size());
  blocks_.push_back(std::move(b));
  return blocks_.back().get();
}

void Plan::release(Block* b) {
  b->held.clear();
  b->versions.clear();
  for (auto& s : b->own) s.reset();
  b->backward_done = false;
  free_.push_back(b);
}

void Plan::bind(Block& b) const {
  for (const auto& [vi, buf] : patches_) b.views[vi].data = b.ptrs[buf];
}

void Plan::run(Block& b, int begin, int end, std::vector<std::vector<unsigned char>>* snapshots) {
  const BufferView* v = b.views.data();
  for (int i = begin; i < end; ++i) {
    const ExecStep& s = steps_[i];
    const std::span<const BufferView> in(v + s.view, s.n_in), out(v + s.view + s.n_in, s.n_out);
    if (s.random) [[unlikely]] {
      RandomAttrs a = s.attrs.as<RandomAttrs>();
      const Generator::Stream st = default_generator(s.device).reserve(s.random_count);
      a.seed = st.seed;
      a.offset = st.offset;
      s.fn(KernelArgs{in, out, AttrBlob::of(a)});
    } else {
      s.fn(KernelArgs{in, out, s.attrs});
    }
    if (snapshots != nullptr) {
      auto keep = [snapshots](const BufferView& bv) {
        const auto* p = static_cast<const unsigned char*>(bv.data);
        snapshots->emplace_back(p, p + bv.numel() * itemsize(bv.dtype));
      };
      if (op_kind(s.op) == OpKind::Inplace) {
        for (int k = 0; k < s.n_in; ++k)
          if (op_mutated_inputs(s.op) >> k & 1) keep(in[k]);
      } else {
        for (const BufferView& o : out) keep(o);
      }
    }
  }
}

}  // namespace encore::schedule
