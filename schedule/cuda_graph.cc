// CUDA-graph replay: what a phase's graph reads from staging copies, the per-arena cache of
// captured graphs keyed by the addresses of bound buffers, capture and its fallback to stream
// replay, and the counters of how replays ran.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#include "runtime/allocator.h"
#include "runtime/env.h"
#include "runtime/rng.h"
#include "schedule/plan.h"

namespace encore::schedule {
namespace {

// Graphs kept per arena and phase: addresses alternate when a caller keeps the previous call's
// outputs while making the next call (y = f(x) in a loop), so two or three sets are common.
constexpr size_t kMaxGraphsPerPhase = 4;
// Failed captures a plan tries again (on a new arena, or with new addresses: what failed may
// have been a block handed out during the capture, or an address) before it replays on the stream
// for good.
constexpr int64_t kMaxCaptureFailures = 3;
// Direct graphs (arguments read where they are) an arena's phase evicts having launched them only
// at their capture, before it stages its arguments for good: addresses that repeat once and never
// again (two calls per batch) would cost a capture per batch.
constexpr int kMaxWastedDirectGraphs = 2;

// ENCORE_CUDA_GRAPH_COPIES=0 copies a phase's arguments into staging on the stream before each
// launch (a cudaMemcpyAsync each) rather than as its graph's first nodes: to compare the two.
// Read once.
bool copies_in_graphs() {
  static const bool on = env::flag("ENCORE_CUDA_GRAPH_COPIES", true);
  return on;
}

std::atomic<bool> g_direct_arguments{env::flag("ENCORE_CUDA_GRAPH_DIRECT_ARGS", true)};

}  // namespace

bool graph_direct_arguments_enabled() {
  return g_direct_arguments.load(std::memory_order_relaxed);
}

bool set_graph_direct_arguments_enabled(bool on) {
  return g_direct_arguments.exchange(on);
}

// What a CUDA graph of each phase reads from staging copies, and where random steps find their
// {seed, offset}.
void Plan::plan_graphs() {
  std::vector<Buffer>& bufs = rec_->buffers;
  // A staged buffer is copied for the bytes its steps read: an argument's storage past its
  // offset may be larger at the trace and smaller at a later call.
  std::vector<size_t> read_bytes(bufs.size(), 0);
  auto note = [&](const Operand& o) {
    read_bytes[o.buf] = std::max(read_bytes[o.buf], o.nbytes());
  };
  for (const Step& s : all_) {
    for (const Operand& o : s.in) note(o);
    for (const Operand& o : s.out) note(o);
  }
  stage_slot_.assign(bufs.size(), -1);
  for (int buf : external_) {
    const Buffer& b = bufs[buf];
    // An argument written in place must be the caller's own buffer: it is keyed, not staged.
    if ((b.kind == BufKind::Arg && !b.mutated) || b.kind == BufKind::GradIn) {
      stage_slot_[buf] = static_cast<int>(stage_slots_++);
      bufs[buf].nbytes = read_bytes[buf];
    }
  }
  // A buffer both phases read is staged once, by the forward (the backward holds the call state),
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
  random_pair_.assign(steps_.size(), -1);
  for (int i = 0; i < static_cast<int>(steps_.size()); ++i) {
    if (!steps_[i].random) continue;
    random_pair_[i] = static_cast<int>(random_steps_.size());
    random_steps_.push_back(i);
    if (i < n_forward_) random_forward_ = random_steps_.size();
  }
}

namespace {
std::atomic<int> g_failing_captures{0};  // fail_next_graph_captures
// The plans' counts summed over the process, and the failed captures.
std::atomic<int64_t> g_launches{0}, g_captures{0}, g_stream_replays{0}, g_failed_captures{0},
    g_deferred_captures{0}, g_forked_captures{0}, g_verified_replays{0}, g_direct_launches{0};
}  // namespace

void fail_next_graph_captures(int n) {
  g_failing_captures.store(n, std::memory_order_relaxed);
}

GraphUseCounts graph_use_counts() {
  return {g_launches.load(std::memory_order_relaxed),
          g_captures.load(std::memory_order_relaxed),
          g_stream_replays.load(std::memory_order_relaxed),
          g_failed_captures.load(std::memory_order_relaxed),
          g_deferred_captures.load(std::memory_order_relaxed),
          g_forked_captures.load(std::memory_order_relaxed),
          g_verified_replays.load(std::memory_order_relaxed),
          g_direct_launches.load(std::memory_order_relaxed)};
}

void Plan::count_launch(bool direct) {
  graph_launches_.fetch_add(1, std::memory_order_relaxed);
  g_launches.fetch_add(1, std::memory_order_relaxed);
  if (direct) {
    direct_launches_.fetch_add(1, std::memory_order_relaxed);
    g_direct_launches.fetch_add(1, std::memory_order_relaxed);
  }
}
void Plan::count_capture() {
  graph_captures_.fetch_add(1, std::memory_order_relaxed);
  g_captures.fetch_add(1, std::memory_order_relaxed);
}
void Plan::count_stream_replay(StreamReplay why) {
  stream_replays_.fetch_add(1, std::memory_order_relaxed);
  g_stream_replays.fetch_add(1, std::memory_order_relaxed);
  if (why == StreamReplay::kVerified) g_verified_replays.fetch_add(1, std::memory_order_relaxed);
}

GraphStats Plan::graph_stats() const {
  GraphStats s;
  s.launches = graph_launches_.load(std::memory_order_relaxed);
  s.direct_launches = direct_launches_.load(std::memory_order_relaxed);
  s.captures = graph_captures_.load(std::memory_order_relaxed);
  s.stream_replays = stream_replays_.load(std::memory_order_relaxed);
  s.capture_failures = capture_failures_.load(std::memory_order_acquire);
  s.deferred_captures = deferred_captures_.load(std::memory_order_acquire);
  if (s.capture_failures > 0 || s.deferred_captures > 0) {
    std::lock_guard<std::mutex> l(fallback_mu_);
    s.last_failure = last_failure_;
    s.last_deferral = last_deferral_;
    if (graphs_off_.load(std::memory_order_acquire)) s.fallback = fallback_;
  }
  return s;
}

void Plan::run_graph(CallState& b, Phase phase, int begin, int end) {
  const bool backward = phase == Phase::Backward;
  const cuda::StreamHandle stream = cuda::current_stream(device_.index);
  const std::vector<Buffer>& bufs = rec_->buffers;

  const std::vector<int>& staged = staged_[phase];
  const auto [p0, p1] = patch_range(phase);
  std::vector<CapturedGraph>& graphs = b.graphs[phase];
  // Whether `key` holds this call's addresses of the phase's non-arena views, and `key` made so.
  const auto this_call = [&](const std::vector<void*>& key) {
    for (size_t k = p0; k < p1; ++k)
      if (key[k - p0] != b.views[patches_[k].first].data) return false;
    return true;
  };
  const auto set_to_this_call = [&](std::vector<void*>& key) {
    key.clear();  // (a kept key has the size already: no allocation)
    for (size_t k = p0; k < p1; ++k) key.push_back(b.views[patches_[k].first].data);
  };

  // Addresses whose capture failed on this arena: replayed on the stream, not captured again.
  std::vector<std::vector<void*>>& failed = b.failed_keys[phase];

  // Arguments and incoming gradients (the staged buffers) are read where they are, by a graph
  // keyed by their addresses like the parameters' ("direct"), once this arena's phase has seen
  // all of its addresses before: the same tensors at every call, or a few in turn (two batches,
  // a loader's buffers), cost no copies. The views are as bind() left them: the callers'
  // addresses, which the keys compare. Addresses whose capture failed are staged (and replay on
  // the stream), and so is every call of a phase whose direct graphs went unused.
  int ring_slot = -1;            // this call's keys in b.recent_keys, if any
  CapturedGraph* hit = nullptr;  // the direct graph of this call's addresses, if any
  const bool direct = graph_direct_arguments_enabled() && [&] {
    if (staged.empty() && (!backward || staged_both_.empty())) return false;
    if (b.wasted_direct[phase] >= kMaxWastedDirectGraphs) return false;
    for (CapturedGraph& g : graphs) {
      if (g.direct && this_call(g.key)) {
        hit = &g;
        return true;
      }
    }
    if (std::any_of(failed.begin(), failed.end(), this_call)) return false;
    // The keys of the phase's last kRecentKeys runs on this arena without a direct graph (a
    // ring): a key seen there again gets one.
    std::array<std::vector<void*>, kRecentKeys>& ring = b.recent_keys[phase];
    for (size_t k = 0; k < kRecentKeys; ++k) {
      if (!ring[k].empty() && this_call(ring[k])) {
        ring_slot = static_cast<int>(k);
        return true;
      }
    }
    ring_slot = static_cast<int>(b.recent_next[phase]++ % kRecentKeys);
    set_to_this_call(ring[ring_slot]);
    return false;
  }();

  // Otherwise they are copied into the call state's staging buffers, which the graph reads (an
  // address of the caller's may change at every call). A copy sits at the caller's
  // address modulo kCudaArenaAlign: cuBLAS and cuDNN choose their kernels by the operands'
  // alignment, so a replay of an argument at an odd offset runs what eager ran on it (and the
  // graph of that alignment: the staged address is part of its key). The phase's own copies are
  // its graph's first nodes, given this call's sources at the launch (b.graph_copies); a stream
  // replay, a backward after a forward that staged nothing, and ENCORE_CUDA_GRAPH_COPIES=0 copy
  // on the stream.
  auto place = [&](const std::vector<int>& list) {
    for (int buf : list) {
      const int slot = stage_slot_[buf];
      IntrusivePtr<Storage>& st = b.staging[slot];
      if (!st) st = make_intrusive<Storage>(bufs[buf].nbytes + kCudaArenaAlign, device_);
      b.staged[slot] = static_cast<char*>(st->data()) +
                       reinterpret_cast<uintptr_t>(b.ptrs[buf]) % kCudaArenaAlign;
    }
  };
  auto copy_on_stream = [&](const std::vector<int>& list) {
    for (int buf : list)
      cuda::copy_bytes(b.staged[stage_slot_[buf]], device_, b.ptrs[buf], device_, bufs[buf].nbytes);
  };
  b.graph_copies.clear();  // (reserved for the larger phase: no allocation)
  const bool in_graph = copies_in_graphs() && !direct;
  if (direct) {
    if (!backward) b.forward_staged = false;
  } else {
    place(staged);
    if (backward && !b.forward_staged) {
      place(staged_both_);
      copy_on_stream(staged_both_);
    }
    if (!backward) b.forward_staged = true;
    for (const auto& [vi, slot] : staged_views_[phase]) b.views[vi].data = b.staged[slot];
    if (in_graph) {
      for (int buf : staged)
        if (bufs[buf].nbytes > 0)
          b.graph_copies.push_back({b.staged[stage_slot_[buf]], b.ptrs[buf], bufs[buf].nbytes});
    } else {
      copy_on_stream(staged);
    }
  }

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

  // Live attributes (an optimizer's, which a schedule may change between calls): kernel
  // arguments a graph captures while they stay as they were on this arena's first run of the
  // phase; once they change, for good (a rate decayed at every call would cost a capture per
  // call), written to the device before each launch for graphs whose update kernels read them
  // there (KernelArgs::device_attrs). So every graph of the phase was captured the way this call
  // runs: with the values it has, or reading them from the device.
  const bool live = live_phase_[phase];
  const auto same_live = [&](const std::vector<AttrBlob>& v) {
    for (size_t k = 0; k < v.size(); ++k)
      if (std::memcmp(v[k].bytes, b.live_attrs[k].bytes, AttrBlob::kCapacity) != 0) return false;
    return true;
  };
  if (live && !b.live_varies[phase]) {
    if (b.first_live[phase].empty()) {
      b.first_live[phase] = b.live_attrs;
    } else if (!same_live(b.first_live[phase])) {
      b.live_varies[phase] = true;
      graphs.clear();  // (captured with the first values: never launched again)
      hit = nullptr;
    }
  }
  const bool device_live = live && b.live_varies[phase];
  b.device_live = device_live;
  if (device_live) {
    const size_t bytes = b.live_attrs.size() * sizeof(AttrBlob);
    if (!b.live_device) b.live_device = make_intrusive<Storage>(bytes, device_);
    // From pageable memory, as the random pairs.
    cuda::copy_bytes(b.live_device->data(), device_, b.live_attrs.data(), Device::cpu(), bytes,
                     /*non_blocking=*/true);
  }

  // The graph for these addresses, or a new capture.
  const auto on_stream = [&](StreamReplay why = StreamReplay::kOther) {
    count_stream_replay(why);
    if (in_graph) copy_on_stream(staged);
    run_steps<false, false>(b, begin, end, nullptr, /*device_random=*/true);
  };
  // A failure, with its reason; kMaxCaptureFailures of them turn graphs off for the plan.
  const auto note_failure = [&](const std::string& what) {
    {
      std::lock_guard<std::mutex> l(fallback_mu_);
      last_failure_ = cat(phase_name(phase), " ", what);
      const int64_t n = capture_failures_.fetch_add(1, std::memory_order_acq_rel) + 1;
      if (n >= kMaxCaptureFailures && !graphs_off_.load(std::memory_order_relaxed)) {
        fallback_ = cat(n, " captures failed; the last: ", last_failure_);
        graphs_off_.store(true, std::memory_order_release);
      }
    }
    g_failed_captures.fetch_add(1, std::memory_order_relaxed);
  };
  // A launch whose copies cannot take this call's sources (memory of another kind than the
  // capture's) fails: the call replays on the stream.
  const auto launch = [&](CapturedGraph& g) {
    g.last_use = graph_clock_.fetch_add(1, std::memory_order_relaxed) + 1;
    if (g.graph.launch(stream, b.graph_copies)) {
      ++g.launches;
      count_launch(direct);
      return;
    }
    note_failure(cat("launch failed: ", g.graph.failure()));
    on_stream();
  };
  if (hit != nullptr) {
    launch(*hit);
    return;
  }
  if (!direct) {
    for (CapturedGraph& g : graphs) {
      if (g.direct || !this_call(g.key)) continue;
      launch(g);
      return;
    }
  }
  // Captured on this thread's own capture stream (no other thread puts work there), and its
  // branches where the phase's steps are on several lanes, then launched on the current stream;
  // not again for addresses whose capture failed on this arena.
  // (Nothing is allocated before a capture is tried: addresses that failed replay on the stream
  // at no cost.)
  if (std::any_of(failed.begin(), failed.end(), this_call)) {
    on_stream();
    return;
  }
  CapturedGraph fresh;
  set_to_this_call(fresh.key);
  fresh.direct = direct;
  std::string failure, deferral;
  try {
    const cuda::StreamHandle side = cuda::capture_stream(device_.index);
    const cuda::StreamGuard on_side(device_.index, side);
    const int64_t allocations = thread_allocation_count();
    if (graph_queue_[phase].entries.empty()) {
      fresh.graph.begin_capture(side);
      run_steps<false, false>(b, begin, end, nullptr, /*device_random=*/true);
    } else {  // the lanes on their streams (lanes.cc)
      const StreamQueue& q = graph_queue_[phase];
      std::array<cuda::StreamHandle, cuda::kCaptureStreams> streams{side};
      for (int k = 1; k < q.streams; ++k) streams[k] = cuda::capture_stream(device_.index, k);
      const std::span<const cuda::StreamHandle> all(streams.data(), q.streams);
      fresh.graph.begin_capture(side, all.subspan(1), q.marks);
      queue_lanes(b, phase, fresh.graph, all);
    }
    const bool captured = fresh.graph.end_capture(b.graph_copies);
    // A block handed out during the capture, even a cached one, is baked into the graph: the
    // next launch would write memory that has since been freed or handed to someone else.
    if (const int64_t n = thread_allocation_count() - allocations; n > 0)
      failure = cat(n, n == 1 ? " allocation" : " allocations",
                    " during the capture (a block would be baked into the graph)");
    else if (!captured)
      failure = fresh.graph.failure();
    else if (g_failing_captures.load(std::memory_order_relaxed) > 0 &&
             g_failing_captures.fetch_sub(1, std::memory_order_relaxed) > 0)
      failure = "failed on purpose (fail_next_graph_captures)";
  } catch (const cuda::NotReadyForCapture& e) {
    fresh.graph.abort_capture();
    deferral = e.what();
  } catch (const std::exception& e) {
    fresh.graph.abort_capture();
    failure = e.what();
  }
  if (!deferral.empty()) {
    // A kernel makes a plan on the stream replay; these addresses capture on the next call.
    {
      std::lock_guard<std::mutex> l(fallback_mu_);
      last_deferral_ = cat(phase_name(phase), " capture deferred: ", deferral);
    }
    deferred_captures_.fetch_add(1, std::memory_order_acq_rel);
    g_deferred_captures.fetch_add(1, std::memory_order_relaxed);
    on_stream();
    return;
  }
  if (!failure.empty()) {
    // These addresses replay on the stream on this arena; others, or another arena, capture
    // again, until kMaxCaptureFailures failures turn graphs off for the plan.
    note_failure(cat("capture failed: ", failure));
    const auto remember = [&](std::vector<void*> key) {
      if (failed.size() >= kMaxGraphsPerPhase) failed.erase(failed.begin());
      failed.push_back(std::move(key));
    };
    remember(std::move(fresh.key));
    // A staged failure's addresses as the callers have them too, so that a later call with them
    // is not captured reading them there either (it stages, and so replays on the stream).
    if (ring_slot >= 0) {
      std::vector<void*>& seen = b.recent_keys[phase][ring_slot];
      if (!direct) remember(seen);
      seen.clear();
    }
    on_stream();
    return;
  }
  count_capture();
  if (direct && ring_slot >= 0) b.recent_keys[phase][ring_slot].clear();  // (its graph has it)
  if (fresh.graph.forks()) g_forked_captures.fetch_add(1, std::memory_order_relaxed);
  // Up to kMaxGraphsPerPhase of each kind (staged, direct), the least recently used evicted.
  CapturedGraph* g = nullptr;
  CapturedGraph* oldest = nullptr;
  size_t kind = 0;
  for (CapturedGraph& x : graphs) {
    if (x.direct != direct) continue;
    ++kind;
    if (oldest == nullptr || x.last_use < oldest->last_use) oldest = &x;
  }
  if (kind < kMaxGraphsPerPhase) {
    g = &graphs.emplace_back(std::move(fresh));
  } else {
    if (direct && oldest->launches <= 1) ++b.wasted_direct[phase];
    g = oldest;
    *g = std::move(fresh);
  }
  launch(*g);
}

}  // namespace encore::schedule
