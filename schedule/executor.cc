// The executor: the compiled ExecSteps (one kernel call over the call state's views each), the
// pool of per-call CallStates (an arena each), the escaping buffers' storage, and the replay
// loop.
#include <algorithm>
#include <cstdio>

#include "runtime/allocator.h"
#include "runtime/comm_progress.h"
#include "runtime/padded_layout.h"
#include "runtime/profiler.h"
#include "runtime/rng.h"
#include "schedule/plan.h"

namespace encore::schedule {
namespace {

// Escaping storages kept per escape slot and arena (CUDA).
constexpr size_t kEscapePool = 4;

// The step times of one profiled replay loop, handed to the profiler once the loop ends.
std::vector<profiler::StepTime>& step_times() {
  thread_local std::vector<profiler::StepTime> times;
  return times;
}

// The group of recorded update step `update` whose parameter is `param`'s buffer, or -1.
int recorded_group(const Step& update, const Operand& param) {
  const size_t size = static_cast<size_t>(op_input_group(update.op));
  for (size_t g = 0; size > 0 && g + size <= update.in.size(); g += size)
    if (update.in[g].buf == param.buf) return static_cast<int>(g / size);
  return -1;
}

}  // namespace

Plan::~Plan() {
  for (auto& b : states_) {
    if (b->arena == nullptr) continue;
    if (shared_arenas_) {
      shared_arenas_->give(b->arena);
      continue;
    }
    // The allocator hands a block out again to work on this thread's stream: that must follow
    // the arena's last run, which may have been on another.
    if (b->stream != nullptr) {
      try {
        cuda::order_after(device_.index, cuda::current_stream(device_.index), b->stream,
                          b->stream_serial);
      } catch (const Error&) {  // a failed device: nothing queued after will run
      }
    }
    allocator_for(device_).deallocate(b->arena, memory_.arena_bytes);
  }
}

void Plan::share_arenas(std::shared_ptr<ArenaPool> pool) {
  if (device_.type == DeviceType::CPU) shared_arenas_ = std::move(pool);
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
    if (s.live >= 0 && rec_->guard_live[s.live]) {
      e.live = s.live;
      live_phase_[t < n_forward_ ? Phase::Forward : Phase::Backward] = true;
    }
    e.view = static_cast<uint32_t>(view_template_.size());
    e.n_in = static_cast<uint32_t>(s.in.size());
    e.n_out = static_cast<uint32_t>(s.out.size());
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
    if (options_.redzones) {
      guard_begin_.push_back(static_cast<uint32_t>(guards_.size()));
      for_each_written(
          s.op, std::span<const Operand>(s.in), std::span<const Operand>(s.out),
          [&](const Operand& o) {
            const int r = root_[o.buf];
            if (offset_[r] < 0) return;
            guards_.push_back({offset_[r] + static_cast<int64_t>(bufs[r].nbytes),
                               offset_[r] + arena_aligned(bufs[r].nbytes, align_) + kRedzoneBytes,
                               o.buf});
          });
    }
  }
  if (options_.redzones) guard_begin_.push_back(static_cast<uint32_t>(guards_.size()));
  if (n_forward_ == static_cast<int>(all_.size())) forward_patches_ = patches_.size();
  for (const Operand& r : results_) external[r.buf] = 1;
  // An escape gets its storage in the phase of its first writer (a WeightGradAdam writes the
  // gradients it computes as inputs).
  std::vector<char> seen(bufs.size(), 0);
  for (int t = 0; t < static_cast<int>(all_.size()); ++t) {
    const Step& s = all_[t];
    for_each_written(s.op, std::span<const Operand>(s.in), std::span<const Operand>(s.out),
                     [&](const Operand& o) {
                       if (escape_[o.buf] < 0 || seen[o.buf]) return;
                       seen[o.buf] = 1;
                       (t < n_forward_ ? fwd_escapes_ : bwd_escapes_).push_back(o.buf);
                     });
  }
  for (size_t b = 0; b < bufs.size(); ++b) {
    if (!external[b]) continue;
    external_.push_back(static_cast<int>(b));
    if (bufs[b].mutated && bufs[b].kind != BufKind::Temp)
      mutated_external_.push_back(static_cast<int>(b));
    if (!bwd_read[b]) continue;
    const BufKind kind = bufs[b].kind;
    if (kind == BufKind::Arg || kind == BufKind::Param || kind == BufKind::GradSlot ||
        kind == BufKind::External)
      backward_reads_.push_back(static_cast<int>(b));
    else if (kind == BufKind::Temp && std::find(fwd_escapes_.begin(), fwd_escapes_.end(),
                                                static_cast<int>(b)) != fwd_escapes_.end())
      backward_escape_reads_.push_back(static_cast<int>(b));
  }
  kernel_state_ = std::make_unique<std::atomic<void*>[]>(steps_.size());
}

CallState* Plan::acquire() {
  // A shared arena is taken per call: the views into it are patched each time.
  auto take_shared = [this](CallState* b) {
    if (memory_.arena_bytes == 0) return b;
    b->arena = shared_arenas_->take(static_cast<size_t>(memory_.arena_bytes));
    for (const auto& [vi, off] : arena_views_)
      b->views[vi].data = static_cast<char*>(b->arena) + off;
    return b;
  };
  {
    std::lock_guard<std::mutex> l(pool_mu_);
    if (!free_.empty()) {
      CallState* b = free_.back();
      free_.pop_back();
      return shared_arenas_ ? take_shared(b) : b;
    }
  }
  auto b = std::make_unique<CallState>();
  b->views = view_template_;
  if (shared_arenas_) {
    take_shared(b.get());
  } else {
    if (memory_.arena_bytes > 0)
      b->arena = allocator_for(device_).allocate(static_cast<size_t>(memory_.arena_bytes));
    for (const auto& [vi, off] : arena_views_)
      b->views[vi].data = static_cast<char*>(b->arena) + off;
  }
  b->ptrs.assign(rec_->buffers.size(), nullptr);
  // (A cpu plan's lanes, whatever the thread count: a state outlives a set_num_threads call.)
  if (!lanes_.forward[1].empty() || !lanes_.backward[1].empty())
    b->done = std::make_unique<std::atomic<uint32_t>[]>(steps_.size());
  b->own.resize(escapes_);
  b->held.reserve(backward_reads_.size());
  b->versions.reserve(backward_reads_.size());
  b->escape_versions.reserve(backward_escape_reads_.size());
  if (device_.type == DeviceType::CUDA) {
    b->escape_pool.resize(escapes_);
    b->escape_fixed.resize(escapes_);
    b->staging.resize(stage_slots_);
    b->staged.resize(stage_slots_, nullptr);
    b->graph_copies.reserve(std::max(staged_.forward.size(), staged_.backward.size()));
  }
  CallState* out = b.get();
  std::lock_guard<std::mutex> l(pool_mu_);
  states_.push_back(std::move(b));
  return out;
}

void Plan::release(CallState* b) {
  b->held.clear();
  b->versions.clear();
  b->escape_versions.clear();
  b->copy_out.clear();  // a run that threw before finish_copy_out leaves its copies pending
  for (auto& s : b->own) s.reset();
  b->backward_done = false;
  b->forward_staged = false;
  if (shared_arenas_ && b->arena != nullptr) {
    shared_arenas_->give(b->arena);
    b->arena = nullptr;
  }
  std::lock_guard<std::mutex> l(pool_mu_);
  free_.push_back(b);
}

int Plan::arenas() const {
  std::lock_guard<std::mutex> l(pool_mu_);
  return static_cast<int>(states_.size());
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

void Plan::take_live_attrs(CallState& b) const {
  if (!live_phase_.forward && !live_phase_.backward) return;
  const Recording& rec = *rec_;
  b.live_attrs.resize(rec.host_guards.size());  // (allocates on a call state's first call only)
  for (size_t k = 0; k < rec.host_guards.size(); ++k)
    if (rec.guard_live[k]) b.live_attrs[k] = rec.host_guards[k]->current();
}

void Plan::run(CallState& b, Phase phase, std::vector<StepSnapshot>* snapshots) {
  const bool backward = phase == Phase::Backward;
  const auto [begin, end] = step_range(phase);
  if (device_.type == DeviceType::CUDA) {
    b.device_live = false;  // (set by run_graph for its run)
    cuda::set_device(device_.index);
    if (const cuda::StreamHandle s = cuda::current_stream(device_.index); s != b.stream)
        [[unlikely]] {
      cuda::order_after(device_.index, s, b.stream, b.stream_serial);
      b.stream = s;
      b.stream_serial = cuda::stream_serial(s);
    }
    if (begin == end) {  // nothing to launch: neither a graph nor a stream replay
      if (!backward) b.forward_staged = false;
      finish_copy_out(b);
      return;
    }
    if (snapshots == nullptr && !profiler::active() && !options_.redzones &&
        !graphs_off_.load(std::memory_order_acquire) && cuda::graphs_enabled()) {
      run_graph(b, phase, begin, end);
      finish_copy_out(b);
      return;
    }
    count_stream_replay(snapshots != nullptr ? StreamReplay::kVerified : StreamReplay::kOther);
    if (!backward) b.forward_staged = false;
  }
  const bool profile = profiler::active();
  if (snapshots == nullptr && !profile && use_lanes(phase)) {
    run_lanes(b, phase);
    return;
  }
  if (options_.redzones) [[unlikely]] {
    if (profile)
      run_steps<true, true>(b, begin, end, snapshots);
    else
      run_steps<false, true>(b, begin, end, snapshots);
  } else if (profile) [[unlikely]] {
    run_steps<true, false>(b, begin, end, snapshots);
  } else {
    run_steps<false, false>(b, begin, end, snapshots);
  }
  finish_copy_out(b);  // (only CUDA escapes are ever copied out)
}

template <bool kProfile, bool kRedzones>
void Plan::run_steps(CallState& b, int begin, int end, std::vector<StepSnapshot>* snapshots,
                     bool device_random) {
  const BufferView* v = b.views.data();
  const bool cuda = device_.type == DeviceType::CUDA;
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
    if constexpr (kRedzones) {
      fill_redzones(b, i);
      if constexpr (kProfile) t = profiler::ticks();  // the fill is not the step's time
    }
    run_step(b, i, device_random);
    comm_progress::poll();
    if constexpr (kProfile) {
      const int64_t now = profiler::ticks();
      const bool backward = i >= n_forward_;
      times->push_back({s.op, backward, backward ? i - n_forward_ : i,
                        shapes ? profile_args_[i] : std::string_view(), t, now});
      t = now;
      if (cuda) b.timeline.mark(stream);
    }
    if constexpr (kRedzones) {
      check_redzones(b, i);
      if constexpr (kProfile) t = profiler::ticks();  // the check is not the next step's time
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
        for (uint32_t k = 0; k < s.n_out; ++k) {
          const FusedOutputOf& of = p.out_instr[k];
          keep(snapshots->emplace_back(StepSnapshot{p.trace_index[of.instr], {}, of.output}),
               out[k]);
        }
      } else if (s.op == Op::WeightBiasGrad) {  // the Matmul's output, then the Sum's
        keep(snapshots->emplace_back(StepSnapshot{s.trace_index, {}}), out[0]);
        const int sum = s.attrs.as<WeightBiasGradAttrs>().sum_index;
        if (sum >= 0) keep(snapshots->emplace_back(StepSnapshot{sum, {}}), out[1]);
      } else if (s.op == Op::LossGradMatmul) {  // the product's output, then the loss gradient's
        keep(snapshots->emplace_back(StepSnapshot{s.trace_index, {}}), out[0]);
        const LossGradMatmulAttrs& a = s.attrs.as<LossGradMatmulAttrs>();
        if (a.grad_index >= 0)
          keep(snapshots->emplace_back(StepSnapshot{a.grad_index, {}}), out[1]);
        if (a.linear != 0 && a.logits_index >= 0)  // the logits: the linear's
          keep(snapshots->emplace_back(StepSnapshot{a.logits_index, {}}), out[2]);
      } else if (s.op == Op::WeightGradAdam || (op_input_group(s.op) > 0 && s.trace_index >= 0 &&
                                                s.n_in != trace_steps_[s.trace_index].in.size())) {
        // Per recorded step: the weight gradient, the bias gradient (the Sum's), and what the
        // update wrote of each group, as recorded: a WeightGradAdam's, or an update that lost
        // groups to WeightGradAdam steps (update_folds.cc).
        const Step& st = all_[i];
        const bool fold = s.op == Op::WeightGradAdam;
        const Op update = fold ? Op::AdamUpdate : s.op;
        const int size = op_input_group(update), first = fold ? 2 : 0;
        const WeightGradAdamAttrs* a = fold ? &s.attrs.as<WeightGradAdamAttrs>() : nullptr;
        if (fold) {
          keep(snapshots->emplace_back(StepSnapshot{s.trace_index, {}}), in[3]);
          if (a->sum_index >= 0 && s.n_in == kWeightGradAdamBiasInputs)
            keep(snapshots->emplace_back(StepSnapshot{a->sum_index, {}}),
                 in[kWeightGradAdamInputs + 1]);
        }
        for (int g0 = first; g0 + size <= static_cast<int>(s.n_in); g0 += size) {
          const int recorded = !fold         ? s.trace_index
                               : g0 == first ? a->weight_update
                                             : a->bias_update;
          if (recorded < 0) continue;
          StepSnapshot& snap = snapshots->emplace_back(
              StepSnapshot{recorded, {}, -1, recorded_group(trace_steps_[recorded], st.in[g0])});
          for (int j = 0; j < size; ++j)
            if (op_writes_input(update, static_cast<size_t>(j))) keep(snap, in[g0 + j]);
        }
      } else if (s.op == Op::StridedCopy) {  // per output, its recorded step's (a split's part)
        const StridedCopyProgram& p = *s.attrs.as<StridedCopyAttrs>().program;
        for (uint32_t k = 0; k < s.n_out; ++k)
          keep(snapshots->emplace_back(StepSnapshot{p.recorded[k].step, {}, p.recorded[k].output}),
               out[k]);
      } else if (const Conv2dAttrs* conv = conv_attrs(s.attrs);
                 conv != nullptr && (conv->layout & kConvPaddedOutput) != 0) {
        // A padded output: its values, as eager's dense buffer holds them.
        StepSnapshot& snap = snapshots->emplace_back(StepSnapshot{s.trace_index, {}});
        append_padded_interior(snap.bytes, out[0], *conv);
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

void Plan::run_step(CallState& b, int i, bool device_random) const {
  const ExecStep& s = steps_[i];
  const BufferView* v = b.views.data() + s.view;
  const std::span<const BufferView> in(v, s.n_in), out(v + s.n_in, s.n_out);
  if (s.random) [[unlikely]] {
    RandomAttrs a = s.attrs.as<RandomAttrs>();
    if (device_random) {
      a.state_ptr = reinterpret_cast<uint64_t>(static_cast<uint64_t*>(b.random_state->data()) +
                                               2 * random_pair_[i]);
    } else {
      const Generator::Stream st = default_generator(device_).reserve(s.random_count);
      a.seed = st.seed;
      a.offset = st.offset;
    }
    s.fn(KernelArgs{in, out, AttrBlob::of(a), &kernel_state_[i]});
  } else if (s.live >= 0) [[unlikely]] {
    // The optimizer's attributes at the call in place of the recorded ones; in a graph that reads
    // them at each launch, also where they lie on the device (cuda_graph.cc).
    const AttrBlob& live = b.live_attrs[s.live];
    const void* device = b.device_live ? static_cast<const char*>(b.live_device->data()) +
                                             static_cast<size_t>(s.live) * sizeof(AttrBlob)
                                       : nullptr;
    if (s.op == Op::WeightGradAdam) {
      const AttrBlob a =
          AttrBlob::of(with_adam(s.attrs.as<WeightGradAdamAttrs>(), live.as<AdamAttrs>()));
      s.fn(KernelArgs{in, out, a, &kernel_state_[i], device});
    } else {
      s.fn(KernelArgs{in, out, live, &kernel_state_[i], device});
    }
  } else {
    s.fn(KernelArgs{in, out, s.attrs, &kernel_state_[i]});
  }
}

// CUDA-graph capture (cuda_graph.cc) records the plain loop.
template void Plan::run_steps<false, false>(CallState&, int, int, std::vector<StepSnapshot>*, bool);

// The guards are filled before every step that writes their blocks, not once per arena: the
// bytes of a block's guard belong to other blocks while it is not alive.
void Plan::fill_redzones(CallState& b, int i) const {
  static const std::vector<unsigned char> fill(kCudaArenaAlign - 1 + kRedzoneBytes, kRedzoneFill);
  for (uint32_t g = guard_begin_[i]; g < guard_begin_[i + 1]; ++g)
    cuda::copy_bytes(static_cast<unsigned char*>(b.arena) + guards_[g].begin, device_, fill.data(),
                     Device::cpu(), static_cast<size_t>(guards_[g].end - guards_[g].begin));
}

void Plan::check_redzones(const CallState& b, int i) const {
  thread_local std::vector<unsigned char> host;  // a cuda guard's bytes
  for (uint32_t g = guard_begin_[i]; g < guard_begin_[i + 1]; ++g) {
    const Guard& guard = guards_[g];
    const size_t n = static_cast<size_t>(guard.end - guard.begin);
    const unsigned char* at = static_cast<const unsigned char*>(b.arena) + guard.begin;
    const unsigned char* bytes = at;
    if (device_.type != DeviceType::CPU) {
      host.resize(n);
      cuda::copy_bytes(host.data(), Device::cpu(), at, device_, n);
      bytes = host.data();
    }
    size_t k = 0;
    while (k < n && bytes[k] == kRedzoneFill) ++k;
    if (k == n) continue;
    const unsigned char found = bytes[k];
    const ExecStep& s = steps_[i];
    const bool backward = i >= n_forward_;
    const int64_t block = offset_[root_[guard.buf]];
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02x", found);
    throw Error(cat("red zone: ", backward ? "backward" : "forward", " step ",
                    backward ? i - n_forward_ : i, " (", op_name(s.op),
                    ") wrote past the end of buffer b", guard.buf, " (arena [", block, ",",
                    guard.begin, ")): the guard byte at arena offset ", guard.begin + k, " holds ",
                    byte, ", not the fill"));
  }
}

}  // namespace encore::schedule
