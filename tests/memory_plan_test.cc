// The memory placement on its own (schedule/memory_plan.h): on random interval sets no two blocks
// alive at one step overlap, every block fits the arena, and the arena lies between the lower
// bound and the naive sum; on small sets the arena is compared with the exhaustive optimum.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <numeric>
#include <random>
#include <vector>

#include "schedule/memory_plan.h"

using encore::schedule::Interval;
using encore::schedule::place_intervals;
using encore::schedule::Placement;

namespace {

bool alive_together(const Interval& a, const Interval& b) {
  return a.first <= b.last && b.first <= a.last;
}

// Everything a placement promises, checked pair by pair.
void check_placement(const std::vector<Interval>& iv, const Placement& p) {
  REQUIRE(p.offsets.size() == iv.size());
  int64_t naive = 0, top = 0;
  int steps = 0;
  for (const Interval& i : iv) {
    naive += i.size;
    steps = std::max(steps, i.last + 1);
  }
  int64_t lower = 0;
  for (int t = 0; t < steps; ++t) {
    int64_t alive = 0;
    for (const Interval& i : iv)
      if (i.first <= t && t <= i.last) alive += i.size;
    lower = std::max(lower, alive);
  }
  for (size_t a = 0; a < iv.size(); ++a) {
    INFO("block " << a << " of " << iv.size());
    REQUIRE(p.offsets[a] >= 0);
    REQUIRE(p.offsets[a] + iv[a].size <= p.memory.arena_bytes);
    top = std::max(top, p.offsets[a] + iv[a].size);
    for (size_t b = a + 1; b < iv.size(); ++b) {
      if (!alive_together(iv[a], iv[b]) || iv[a].size == 0 || iv[b].size == 0) continue;
      INFO("blocks " << a << " and " << b);
      REQUIRE(
          (p.offsets[a] + iv[a].size <= p.offsets[b] || p.offsets[b] + iv[b].size <= p.offsets[a]));
    }
  }
  CHECK(p.memory.arena_bytes == top);
  CHECK(p.memory.naive_bytes == naive);
  CHECK(p.memory.lower_bound_bytes == lower);
  CHECK(p.memory.lower_bound_bytes <= p.memory.arena_bytes);
  CHECK(p.memory.arena_bytes <= p.memory.naive_bytes);
}

std::vector<Interval> random_intervals(std::mt19937& rng, int n, int steps, int64_t max_units,
                                       int64_t unit) {
  std::uniform_int_distribution<int> step(0, steps - 1);
  std::uniform_int_distribution<int64_t> units(0, max_units);
  std::vector<Interval> iv;
  for (int k = 0; k < n; ++k) {
    int a = step(rng), b = step(rng);
    if (a > b) std::swap(a, b);
    iv.push_back({units(rng) * unit, a, b});
  }
  return iv;
}

// The smallest arena any placement reaches. Some order of placing the blocks, each at the lowest
// offset where it overlaps none placed before it that is alive with it, reaches the optimum:
// placing in the order of an optimal placement's offsets puts every block at or below its
// offset there.
int64_t optimal_arena(const std::vector<Interval>& iv) {
  std::vector<int> order(iv.size());
  std::iota(order.begin(), order.end(), 0);
  int64_t best = INT64_MAX;
  std::vector<int64_t> offset(iv.size());
  do {
    int64_t arena = 0;
    for (size_t k = 0; k < order.size() && arena < best; ++k) {
      const Interval& i = iv[order[k]];
      // The lowest fitting offset is 0 or the end of a block placed before.
      int64_t at = INT64_MAX;
      for (size_t c = 0; c <= k; ++c) {
        const int64_t candidate = c == k ? 0 : offset[order[c]] + iv[order[c]].size;
        if (candidate >= at) continue;
        bool fits = true;
        for (size_t j = 0; j < k && fits; ++j) {
          const Interval& o = iv[order[j]];
          fits = !alive_together(i, o) || i.size == 0 || o.size == 0 ||
                 candidate + i.size <= offset[order[j]] || offset[order[j]] + o.size <= candidate;
        }
        if (fits) at = candidate;
      }
      offset[order[k]] = at;
      arena = std::max(arena, at + i.size);
    }
    best = std::min(best, arena);
  } while (std::next_permutation(order.begin(), order.end()));
  return best;
}

}  // namespace

TEST_CASE("memory plan: random interval sets are placed without overlap", "[memory_plan]") {
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    const int n = std::uniform_int_distribution<int>(1, 80)(rng);
    const int steps = std::uniform_int_distribution<int>(1, 60)(rng);
    // Aligned sizes as the plans give (some zero), or arbitrary byte counts.
    const bool aligned = seed % 2 == 0;
    const std::vector<Interval> iv =
        random_intervals(rng, n, steps, aligned ? 64 : 5000, aligned ? 64 : 1);
    const Placement p = place_intervals(iv);
    check_placement(iv, p);
    if (aligned)
      for (int64_t off : p.offsets) CHECK(off % 64 == 0);
  }
}

TEST_CASE("memory plan: small sets against the exhaustive optimum", "[memory_plan]") {
  double worst_optimum = 1, worst_lower = 1;
  int optimal = 0, instances = 0;
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(1000 + seed);
    const int n = std::uniform_int_distribution<int>(1, 7)(rng);
    const int steps = std::uniform_int_distribution<int>(1, 8)(rng);
    const std::vector<Interval> iv = random_intervals(rng, n, steps, 8, 64);
    const Placement p = place_intervals(iv);
    check_placement(iv, p);
    const int64_t best = optimal_arena(iv);
    REQUIRE(best >= p.memory.lower_bound_bytes);
    REQUIRE(p.memory.arena_bytes >= best);
    ++instances;
    if (best == 0) continue;
    optimal += p.memory.arena_bytes == best;
    worst_optimum = std::max(worst_optimum, double(p.memory.arena_bytes) / double(best));
    worst_lower =
        std::max(worst_lower, double(p.memory.arena_bytes) / double(p.memory.lower_bound_bytes));
  }
  std::cout << "memory plan: " << optimal << " of " << instances
            << " small instances placed optimally; worst arena / optimum " << worst_optimum
            << ", worst arena / lower bound " << worst_lower << "\n";
  // Best fit, largest first, stays within a small factor of the optimum on these sizes.
  CHECK(worst_optimum < 2.0);
}

TEST_CASE("memory plan: edge cases", "[memory_plan]") {
  SECTION("no intervals") {
    const Placement p = place_intervals({});
    CHECK(p.offsets.empty());
    CHECK(p.memory.arena_bytes == 0);
    CHECK(p.memory.lower_bound_bytes == 0);
    CHECK(p.memory.naive_bytes == 0);
  }
  SECTION("one interval") {
    const std::vector<Interval> iv = {{192, 3, 5}};
    const Placement p = place_intervals(iv);
    CHECK(p.offsets == std::vector<int64_t>{0});
    CHECK(p.memory.arena_bytes == 192);
    CHECK(p.memory.lower_bound_bytes == 192);
    CHECK(p.memory.naive_bytes == 192);
  }
  SECTION("zero-size intervals take no room") {
    const std::vector<Interval> iv = {{0, 0, 4}, {128, 1, 2}, {0, 2, 2}, {64, 2, 3}};
    const Placement p = place_intervals(iv);
    check_placement(iv, p);
    CHECK(p.memory.arena_bytes == 192);
  }
  SECTION("a block reuses the place of one that died") {
    const std::vector<Interval> iv = {{256, 0, 2}, {128, 1, 3}, {256, 3, 4}};
    const Placement p = place_intervals(iv);
    CHECK(p.offsets == std::vector<int64_t>{0, 256, 0});
    CHECK(p.memory.arena_bytes == 384);
    CHECK(p.memory.lower_bound_bytes == 384);
    CHECK(p.memory.naive_bytes == 640);
  }
  SECTION("the smallest gap that fits is taken") {
    // Blocks alive at step 0 only leave gaps of 128 bytes at [256,384) and of 64 at [512,576)
    // among the long-lived ones: the last block goes into the 64-byte gap (first fit would take
    // 256, and the top is 640).
    const std::vector<Interval> iv = {{256, 0, 9}, {128, 0, 0}, {128, 0, 9},
                                      {64, 0, 0},  {64, 0, 9},  {64, 5, 5}};
    const Placement p = place_intervals(iv);
    check_placement(iv, p);
    CHECK(p.offsets == std::vector<int64_t>{0, 256, 384, 512, 576, 512});
    CHECK(p.memory.arena_bytes == 640);
  }
}
