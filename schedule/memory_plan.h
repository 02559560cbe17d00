// Memory placement as a pure function, the way ggml-alloc and tinygrad plan memory: blocks come
// in with a size and the steps during which they are alive; an offset in one arena comes out for
// each, such that no two blocks alive at the same step overlap. Plan::plan_memory (passes.cc)
// decides which buffers are blocks (the arena's temporaries, one per in-place root), how large
// (aligned, plus red zones) and when they are alive; this decides where they go.
//
//   std::vector<Interval> blocks = {{256, 0, 2}, {128, 1, 3}, {256, 3, 4}};
//   Placement p = place_intervals(blocks);  // offsets {0, 256, 0}; arena 384 bytes
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace encore::schedule {

// A block of `size` bytes alive from step `first` to step `last`, both included.
struct Interval {
  int64_t size = 0;
  int first = 0, last = 0;
};

// How well a plan uses memory: its arena against the two figures bounding it.
struct MemoryPlan {
  int64_t arena_bytes = 0;
  int64_t lower_bound_bytes = 0;  // the most bytes alive at one step: no placement needs less
  int64_t naive_bytes = 0;        // every block in a place of its own
  int64_t in_place_steps = 0;     // steps whose output took over a dying input's block
  int64_t redzone_bytes = 0;      // guard bytes after each block (0: no red zones)
};

struct Placement {
  std::vector<int64_t> offsets;  // per interval, in the order given
  MemoryPlan memory;             // arena, lower bound and naive sum of the intervals
};

// Best fit, largest first: each block (ties in the order given) goes into the smallest gap
// between the blocks already placed that are alive at the same time, or above them all. Offsets
// are multiples of the sizes' common alignment when every size is.
Placement place_intervals(std::span<const Interval> intervals);

}  // namespace encore::schedule
