// Two lanes: a cpu schedule replayed on two threads. The forward and backward of a training step
// have independent steps (a layer's weight and input gradients, the updates of different
// parameters, a bias gradient beside the next layer's matmul) that an op-by-op runtime runs one
// after the other, each split across the cores or not at all; a plan knows the whole phase and
// can run them side by side, and still give a large step both threads.
//
// Plan time: the steps of a phase form a graph, an edge where two steps touch the same memory and
// one of them writes it (arena bytes, or a storage outside the arena, so the arena's reuse of a
// block is an edge too), plus the order of the steps that draw random numbers and of the
// collectives (every rank makes them in one order), which run on lane 0, the calling thread. A list
// scheduler with a cost per step (multiply-adds for products and convolutions, elements touched for
// the rest) places each step, longest remaining path first, as early as its inputs allow: a large
// step whose kernel splits its work (kSplits) on both lanes (wide) unless another large step is
// ready to run beside it, the rest on the lane where it can start first. Each lane's program is
// its steps in placement order, and every edge points to an earlier placement, so the lanes cannot
// wait on each other in a circle.
//
// Replay: lane 0 on the calling thread, lane 1 on the pool's (runtime/parallel.h). An entry
// waits for the other lane's steps it reads or overwrites (a per-step stamp of the run that
// finished it), runs its kernel on this thread, and stamps it. Inside a lane parallel_for runs the
// pool's chunks itself, or, in a wide step, shares them with lane 1, so every kernel computes the
// bits it computes eagerly at two threads. No lock, lookup or allocation; a kernel that throws
// stops both lanes and the error reaches the caller.
//
// CUDA: the schedule has cuda::graph_streams() lanes (2 by default), and a phase's graph is
// captured on as many streams, a lane each (cuda::Graph's branches), so the device runs the lanes'
// kernels side by side: the small kernels of a training step (a layer's weight, bias and input
// gradients) each fill a fraction of the device, and a graph on one stream runs them one after
// the other. Every step costs one launch plus its work (no step goes wide), and the steps are
// queued in the order the scheduler placed them, so each lane's stream runs its steps in that
// order: a step waits (a mark of another stream) only for the latest step of each other lane it
// depends on, and only when its stream does not follow that step already (lane_schedule.h). Each
// kernel runs with its own stream's cuBLAS and cuDNN handles and workspaces, and computes what it
// computes on one stream, so the bits are eager's.
#include <algorithm>
#include <atomic>
#include <exception>
#include <limits>
#include <vector>

#include "runtime/comm_progress.h"
#include "schedule/plan.h"

namespace encore::schedule {
namespace {

// A step of this cost or more runs on both lanes; about where its kernel splits its work.
constexpr double kWideCost = 1e6;
// The cost of an element a step that is not a product reads or writes, in multiply-adds (an
// elementwise pass or an optimizer update streams its operands at about this rate).
constexpr double kElementCost = 4;
// Phases longer than this replay in order (the graph is built pairwise, in quadratic time).
constexpr int kMaxSteps = 4096;
// On CUDA, a step's cost is a launch plus its work, in units of about one small kernel's time;
// the work is step_cost() over the work about one such time covers.
constexpr double kDeviceWorkPerLaunch = 1e7;

// A buffer's memory as a step touches it: bytes [lo, hi) of the arena (storage -1) or all of a
// storage outside it.
struct Region {
  int storage;
  int64_t lo, hi;
  bool write;
};

bool conflict(const std::vector<Region>& a, const std::vector<Region>& b) {
  for (const Region& x : a)
    for (const Region& y : b)
      if ((x.write || y.write) && x.storage == y.storage && x.lo < y.hi && y.lo < x.hi) return true;
  return false;
}

// A step's work in multiply-adds (products, convolutions) or elements touched (the rest).
double step_cost(const Step& s) {
  auto numel = [](const Operand& o) { return static_cast<double>(o.shape.numel()); };
  switch (s.op) {
    case Op::Linear:
    case Op::LinearAct:
      return numel(s.out[0]) * static_cast<double>(s.in[1].shape[1]);
    case Op::Matmul:
    case Op::MatmulActGrad: {
      const MatmulAttrs& a =
          s.op == Op::Matmul ? s.attrs.as<MatmulAttrs>() : s.attrs.as<MatmulActAttrs>().matmul;
      const Shape& x = s.in[0].shape;
      return numel(s.out[0]) * static_cast<double>(a.trans_a ? x.at(-2) : x.at(-1));
    }
    case Op::WeightBiasGrad:  // a [k, m]: k multiply-adds per product element
      return numel(s.out[0]) * static_cast<double>(s.in[0].shape[0]);
    case Op::LossGradMatmul: {  // g [m, k]: k per product element, the gradient's, the logits'
      const LossGradMatmulAttrs& a = s.attrs.as<LossGradMatmulAttrs>();
      const double k = static_cast<double>(s.out[1].shape[1]);
      const double logits =
          a.linear != 0 ? numel(s.out[1]) * static_cast<double>(s.in[1].shape[1]) : 0;
      return numel(s.out[0]) * k + numel(s.out[1]) * kElementCost + logits;
    }
    case Op::WeightGradAdam: {  // the weight gradient's k per element, then the updates'
      double updates = 0;
      for (size_t i = 2; i < s.in.size(); ++i) updates += numel(s.in[i]);
      return numel(s.in[3]) * static_cast<double>(s.in[0].shape[0]) + kElementCost * updates;
    }
    case Op::Conv2d:
    case Op::Conv2dAct:
    case Op::Conv2dGradInput:
    case Op::Conv2dGradWeight: {
      // Per output (input, weight-gradient) element of the convolution: taps of the weight.
      const Operand& w = s.op == Op::Conv2dGradWeight ? s.out[0] : s.in[1];
      const Operand& y = s.op == Op::Conv2d || s.op == Op::Conv2dAct
                             ? s.out[0]
                             : s.in[s.op == Op::Conv2dGradWeight ? 1 : 0];
      return numel(y) * numel(w) / static_cast<double>(std::max<int64_t>(1, w.shape[0]));
    }
    default: {
      double n = 0;
      for (const Operand& o : s.in) n += numel(o);
      for (const Operand& o : s.out) n += numel(o);
      return kElementCost * n;
    }
  }
}

}  // namespace

void Plan::plan_lanes() {
  const bool cuda = device_.type == DeviceType::CUDA;
  // (One stream: the plain capture.)
  const int streams = cuda ? cuda::graph_streams() : 1;
  if (cuda && streams < 2) return;
  const std::vector<Buffer>& bufs = rec_->buffers;
  const std::vector<int> memory = storage_ids();
  const int n = static_cast<int>(all_.size());
  step_lane_.assign(n, 0);

  // What each step touches.
  std::vector<std::vector<Region>> touches(n);
  for (int t = 0; t < n; ++t) {
    const Step& s = all_[t];
    auto add = [&](const Operand& o, bool write) {
      const int r = root_[o.buf];
      if (offset_[r] >= 0)
        touches[t].push_back(
            {-1, offset_[r], offset_[r] + static_cast<int64_t>(bufs[r].nbytes), write});
      else
        touches[t].push_back({memory[o.buf], 0, 1, write});
    };
    for (size_t i = 0; i < s.in.size(); ++i) add(s.in[i], op_writes_input(s.op, i));
    for (const Operand& o : s.out) add(o, true);
  }

  for (const Phase phase : {Phase::Forward, Phase::Backward}) {
    const auto [begin, end] = step_range(phase);
    const int count = end - begin;
    if (count == 0 || count > kMaxSteps) continue;
    // The graph (indices within the phase): deps[j] are the earlier steps j must follow.
    std::vector<std::vector<int>> deps(count);
    int last_random = -1, last_collective = -1;
    auto follow = [&](int j, int& last) {
      if (last >= 0 && std::find(deps[j].begin(), deps[j].end(), last) == deps[j].end())
        deps[j].push_back(last);
      last = j;
    };
    // A write outside the arena (a parameter, optimizer state, a gradient handed out) waits
    // for every step recorded before it that may throw midway (value_checks.cc): a call that
    // fails there has written no more than eager had.
    std::vector<char> throws(count), writes_out(count);
    for (int j = 0; j < count; ++j) {
      throws[j] = throws_midway(all_[begin + j]);
      for (const Region& r : touches[begin + j]) writes_out[j] |= r.write && r.storage >= 0;
    }
    for (int j = 0; j < count; ++j) {
      for (int i = 0; i < j; ++i)
        if (conflict(touches[begin + i], touches[begin + j]) || (throws[i] && writes_out[j]))
          deps[j].push_back(i);
      // (On CUDA each random step reads its own {seed, offset} pair, reserved in step order
      // before the launch: they need no order among themselves.)
      if (!cuda && steps_[begin + j].random) follow(j, last_random);
      if (op_collective(all_[begin + j].op)) follow(j, last_collective);
    }
    // Per step its cost on one lane, whether its kernel splits (it may go on both lanes), and
    // whether it must run on lane 0 (a collective calls MPI, which this process joined for one
    // thread at a time).
    std::vector<double> cost(count);
    std::vector<char> splits(count), lane0_only(count);
    for (int j = 0; j < count; ++j) {
      cost[j] = step_cost(all_[begin + j]);
      splits[j] = !cuda && op_splits(all_[begin + j].op) && cost[j] >= kWideCost;
      if (cuda) cost[j] = 1 + cost[j] / kDeviceWorkPerLaunch;
      lane0_only[j] = op_collective(all_[begin + j].op);
    }
    const LanePlacement placement =
        place_on_lanes(deps, cost, splits, lane0_only, cuda ? streams : 2);
    std::copy(placement.lane.begin(), placement.lane.end(), step_lane_.begin() + begin);
    if (cuda) {
      graph_queue_[phase] = {};
      if (std::all_of(placement.lane.begin(), placement.lane.end(),
                      [](int8_t l) { return l == 0; }))
        continue;  // the plain capture
      graph_queue_[phase] = queue_on_streams(deps, placement.lane, placement.placed, streams);
      for (GraphEntry& e : graph_queue_[phase].entries) e.step += begin;
      continue;
    }
    // Each lane's program: its steps in placement order, with the other lane's steps each waits
    // for; a wide step is in both.
    std::array<std::vector<LaneEntry>, 2>& programs = lanes_[phase];
    for (const int j : placement.placed) {
      const int lane = placement.lane[j];
      for (int l = 0; l < 2; ++l) {
        if (lane != kBothLanes && lane != l) continue;
        LaneEntry e;
        e.step = begin + j;
        e.wide = lane == kBothLanes;
        e.waits_begin = static_cast<uint32_t>(lane_waits_.size());
        // Lane 1 serves a wide step's chunks: it waits for nothing but the step's end.
        if (!(e.wide && l == 1))
          for (int i : deps[j])
            if (placement.lane[i] == 1 - l) lane_waits_.push_back(begin + i);
        e.waits_end = static_cast<uint32_t>(lane_waits_.size());
        programs[l].push_back(e);
      }
    }
  }
}

void Plan::queue_lanes(CallState& b, Phase phase, cuda::Graph& graph,
                       std::span<const cuda::StreamHandle> streams) {
  const StreamQueue& q = graph_queue_[phase];
  for (const GraphEntry& e : q.entries) {
    const cuda::StreamHandle s = streams[e.stream];
    for (uint32_t w = e.waits_begin; w < e.waits_end; ++w) graph.after(s, q.waits[w]);
    {
      const cuda::StreamGuard on(device_.index, s);
      run_step(b, e.step, /*device_random=*/true);
    }
    comm_progress::poll();
    if (e.mark >= 0) graph.mark(e.mark, s);
  }
}

bool Plan::use_lanes(Phase phase) const {
  return device_.type == DeviceType::CPU && !lanes_[phase][1].empty() && num_threads() == 2;
}

void Plan::run_lanes(CallState& b, Phase phase) {
  const uint32_t run = ++b.runs;
  lane_replays_.fetch_add(1, std::memory_order_relaxed);
  LanePair pair;
  std::exception_ptr error[2];
  int at[2] = {-1, -1};
  std::atomic<int> first_failure{std::numeric_limits<int>::max()};
  pair.run([&](int lane) {
    try {
      run_lane(b, phase, lane, run, pair, at[lane], first_failure);
    } catch (...) {
      error[lane] = std::current_exception();
      int seen = first_failure.load(std::memory_order_relaxed);
      while (at[lane] < seen && !first_failure.compare_exchange_weak(seen, at[lane])) {
      }
      pair.fail();
    }
  });
  // The error of the step recorded first: the one eager would have raised.
  const int lane = error[0] && error[1] ? (at[1] < at[0] ? 1 : 0) : (error[0] ? 0 : 1);
  if (error[lane]) std::rethrow_exception(error[lane]);
}

void Plan::run_lane(CallState& b, Phase phase, int lane, uint32_t run, LanePair& pair, int& at,
                    const std::atomic<int>& first_failure) const {
  auto finished = [&](int step) { return b.done[step].load(std::memory_order_acquire) == run; };
  for (const LaneEntry& e : lanes_[phase][lane]) {
    // The other lane's step threw: this one runs on through the steps recorded before it (eager
    // ran them before it failed there, and one may fail first), alone, while what they wait for
    // is done.
    if (pair.failed() && (e.wide || e.step > first_failure.load(std::memory_order_relaxed))) return;
    for (uint32_t w = e.waits_begin; w < e.waits_end; ++w) {
      SpinWait wait;
      while (!finished(lane_waits_[w])) {
        if (pair.failed()) return;
        wait();
      }
    }
    at = e.step;
    if (e.wide && lane == 1) {
      pair.serve([&] { return finished(e.step); });
      continue;
    }
    if (e.wide) pair.begin_wide();
    run_step(b, e.step, false);
    if (lane == 0) comm_progress::poll();  // the thread that started the communication
    if (e.wide) pair.end_wide();
    // A wide step cut short by the other lane's failure lacks that lane's part: not done.
    if (e.wide && pair.failed()) return;
    b.done[e.step].store(run, std::memory_order_release);
  }
}

}  // namespace encore::schedule
