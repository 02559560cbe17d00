// place_intervals: best fit, largest first (memory_plan.h).
#include "schedule/memory_plan.h"

#include <algorithm>
#include <numeric>

namespace encore::schedule {

Placement place_intervals(std::span<const Interval> intervals) {
  Placement out;
  MemoryPlan& m = out.memory;
  out.offsets.assign(intervals.size(), -1);
  int steps = 0;
  for (const Interval& iv : intervals) {
    m.naive_bytes += iv.size;
    steps = std::max(steps, iv.last + 1);
  }

  std::vector<int64_t> alive(static_cast<size_t>(steps) + 1, 0);
  for (const Interval& iv : intervals) {
    alive[iv.first] += iv.size;
    alive[iv.last + 1] -= iv.size;
  }
  int64_t running = 0;
  for (int64_t a : alive) {
    running += a;
    m.lower_bound_bytes = std::max(m.lower_bound_bytes, running);
  }

  std::vector<int> order(intervals.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return intervals[a].size > intervals[b].size; });
  struct Placed {
    int64_t offset, size;
    int first, last;
  };
  std::vector<Placed> placed;
  std::vector<const Placed*> overlapping;
  for (int k : order) {
    const Interval& iv = intervals[k];
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
    out.offsets[k] = best;
    placed.push_back({best, iv.size, iv.first, iv.last});
    m.arena_bytes = std::max(m.arena_bytes, best + iv.size);
  }
  return out;
}

}  // namespace encore::schedule
