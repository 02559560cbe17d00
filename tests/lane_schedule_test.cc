// The lane schedule and the queue order on several streams on their own
// (schedule/lane_schedule.h). The placement on 2 to 4 lanes is an order that keeps every
// dependency, with collectives on lane 0 and only splitting steps on both lanes of two. The queue
// on 2 to 4 streams, run as the device runs it (each stream in queue order, a wait on a mark after
// the step that set it), keeps every dependency, and no wait is one the streams' order implied
// already. Random dependency graphs, and a training step's shape by hand.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "schedule/lane_schedule.h"

using encore::schedule::GraphEntry;
using encore::schedule::kBothLanes;
using encore::schedule::kMaxLanes;
using encore::schedule::LanePlacement;
using encore::schedule::place_on_lanes;
using encore::schedule::queue_on_streams;
using encore::schedule::StreamQueue;

namespace {

// A backward of two linear layers: 0 the loss gradient; 1 dW2, 2 db2 and 3 dx2 read it; 4 the relu
// gradient of dx2; 5 dW1, 6 db1 read that; 7 the optimizer update reads every gradient.
const std::vector<std::vector<int>> kTwoLayerBackward = {{},  {0}, {0}, {0},
                                                         {3}, {4}, {4}, {1, 2, 5, 6}};

// before[a][b]: queue entry a runs before entry b on the device, from the streams' order and the
// marks, leaving out wait `skip` (an index into q.waits; -1: none).
std::vector<std::vector<char>> runs_before(const StreamQueue& q, int skip = -1) {
  const int n = static_cast<int>(q.entries.size());
  std::vector<std::vector<char>> before(n, std::vector<char>(n, 0));
  std::vector<int> setter(n, -1);          // per mark, the entry that set it
  int last[kMaxLanes] = {-1, -1, -1, -1};  // per stream, its last entry so far
  for (int p = 0; p < n; ++p) {
    const GraphEntry& e = q.entries[p];
    auto inherit = [&](int a) {
      before[a][p] = 1;
      for (int x = 0; x < p; ++x) before[x][p] |= before[x][a];
    };
    if (last[e.stream] >= 0) inherit(last[e.stream]);
    REQUIRE(e.waits_begin <= e.waits_end);
    REQUIRE(e.waits_end <= q.waits.size());
    for (uint32_t w = e.waits_begin; w < e.waits_end; ++w) {
      const int mark = q.waits[w];
      REQUIRE((mark >= 0 && mark < q.marks));
      REQUIRE(setter[mark] >= 0);  // set before it is waited for
      if (static_cast<int>(w) != skip) inherit(setter[mark]);
    }
    last[e.stream] = p;
    if (e.mark >= 0) {
      REQUIRE(e.mark < q.marks);
      REQUIRE(setter[e.mark] < 0);  // each mark is set once
      setter[e.mark] = p;
    }
  }
  return before;
}

// Every promise of queue_on_streams for one graph, lanes, placement and number of streams.
void check_order(const std::vector<std::vector<int>>& deps, const std::vector<int8_t>& lane,
                 const std::vector<int>& placed, int streams) {
  const StreamQueue q = queue_on_streams(deps, lane, placed, streams);
  const int n = static_cast<int>(placed.size());
  REQUIRE(static_cast<int>(q.entries.size()) == n);
  REQUIRE(q.streams == (n == 0 ? 0 : 1 + *std::max_element(lane.begin(), lane.end())));
  std::vector<int> at(n);
  int set = 0;
  for (int p = 0; p < n; ++p) {
    REQUIRE(q.entries[p].step == placed[p]);
    REQUIRE(q.entries[p].stream == lane[placed[p]]);
    at[placed[p]] = p;
    set += q.entries[p].mark >= 0;
  }
  REQUIRE(q.marks == set);  // numbered 0 to marks - 1 (each set once, checked below)
  const auto before = runs_before(q);
  for (int j = 0; j < n; ++j)
    for (int i : deps[j]) REQUIRE(before[at[i]][at[j]]);
  // Each wait is needed: without it, some dependency of its step is not kept.
  for (int p = 0; p < n; ++p) {
    const GraphEntry& e = q.entries[p];
    for (uint32_t w = e.waits_begin; w < e.waits_end; ++w) {
      const auto without = runs_before(q, static_cast<int>(w));
      bool needed = false;
      for (int i : deps[e.step]) needed = needed || !without[at[i]][p];
      REQUIRE(needed);
    }
  }
}

}  // namespace

TEST_CASE("a capture order on 2 to 4 streams keeps every dependency with no wait implied",
          "[static][cuda_graphs]") {
  std::mt19937 rng(7);
  for (int round = 0; round < 600; ++round) {
    const int streams = 2 + round % 3;
    const int n = 1 + static_cast<int>(rng() % 40);
    const int fan = static_cast<int>(rng() % 4);  // up to fan dependencies per step
    std::vector<std::vector<int>> deps(n);
    for (int j = 1; j < n; ++j)
      for (int k = 0; k < fan; ++k) {
        const int i = static_cast<int>(rng() % j);
        if (std::find(deps[j].begin(), deps[j].end(), i) == deps[j].end()) deps[j].push_back(i);
      }
    std::vector<int8_t> lane(n);
    for (int8_t& l : lane) l = static_cast<int8_t>(rng() % streams);
    // A random placement that keeps the dependencies, as the list scheduler's does.
    std::vector<int> waiting(n), placed;
    std::vector<std::vector<int>> users(n);
    for (int j = 0; j < n; ++j) {
      waiting[j] = static_cast<int>(deps[j].size());
      for (int i : deps[j]) users[i].push_back(j);
    }
    std::vector<int> ready;
    for (int j = 0; j < n; ++j)
      if (waiting[j] == 0) ready.push_back(j);
    while (!ready.empty()) {
      const size_t k = rng() % ready.size();
      const int j = ready[k];
      ready.erase(ready.begin() + static_cast<std::ptrdiff_t>(k));
      placed.push_back(j);
      for (int u : users[j])
        if (--waiting[u] == 0) ready.push_back(u);
    }
    INFO("round " << round << ", " << n << " steps on " << streams << " streams");
    check_order(deps, lane, placed, streams);
  }
}

TEST_CASE("a layer's gradients queued on two streams wait only where they meet",
          "[static][cuda_graphs]") {
  const std::vector<std::vector<int>>& deps = kTwoLayerBackward;
  const std::vector<int8_t> lane = {0, 1, 1, 0, 0, 0, 1, 0};
  const std::vector<int> placed = {0, 3, 1, 4, 2, 5, 6, 7};
  const StreamQueue q = queue_on_streams(deps, lane, placed, 2);
  // Stream 1 waits for the loss gradient once (dW2 and db2 follow it) and for the relu gradient
  // once (db1); the update waits for stream 1's last step only.
  REQUIRE(q.marks == 3);
  std::vector<int> waits;
  for (const GraphEntry& e : q.entries) waits.push_back(e.waits_end - e.waits_begin);
  REQUIRE(waits == std::vector<int>{0, 0, 1, 0, 0, 0, 1, 1});
  check_order(deps, lane, placed, 2);
  // On three streams, a wait for a step brings what that step's stream followed: step 3 (on
  // stream 2) waits for step 1 (stream 1), so step 4 (stream 0), which depends on steps 1 and 3,
  // waits for step 3 alone.
  const std::vector<std::vector<int>> chain = {{}, {0}, {}, {1}, {1, 3}};
  const StreamQueue three = queue_on_streams(chain, {0, 1, 0, 2, 0}, {0, 1, 2, 3, 4}, 3);
  REQUIRE(three.entries[4].waits_end - three.entries[4].waits_begin == 1);
  check_order(chain, {0, 1, 0, 2, 0}, {0, 1, 2, 3, 4}, 3);
}

TEST_CASE("a lane schedule keeps every dependency, collectives on lane 0", "[static][lanes]") {
  std::mt19937 rng(11);
  for (int round = 0; round < 300; ++round) {
    const int n = 1 + static_cast<int>(rng() % 40);
    std::vector<std::vector<int>> deps(n);
    for (int j = 1; j < n; ++j)
      for (int k = static_cast<int>(rng() % 4); k > 0; --k) {
        const int i = static_cast<int>(rng() % j);
        if (std::find(deps[j].begin(), deps[j].end(), i) == deps[j].end()) deps[j].push_back(i);
      }
    std::vector<double> cost(n);
    std::vector<char> splits(n), lane0_only(n);
    const bool device = round % 2 == 0;  // as on CUDA: no step splits, 2 to 4 lanes
    const int lanes = device ? 2 + round / 2 % 3 : 2;
    for (int j = 0; j < n; ++j) {
      cost[j] = 1 + static_cast<double>(rng() % 100);
      splits[j] = !device && rng() % 4 == 0;
      lane0_only[j] = !splits[j] && rng() % 8 == 0;  // (a collective never splits)
    }
    INFO("round " << round << ", " << n << " steps");
    const LanePlacement p = place_on_lanes(deps, cost, splits, lane0_only, lanes);
    REQUIRE(static_cast<int>(p.lane.size()) == n);
    REQUIRE(static_cast<int>(p.placed.size()) == n);
    std::vector<int> at(n, -1);
    for (int k = 0; k < n; ++k) {
      REQUIRE(at[p.placed[k]] < 0);  // each step once
      at[p.placed[k]] = k;
    }
    int on_lane1 = 0;
    for (int j = 0; j < n; ++j) {
      for (int i : deps[j]) REQUIRE(at[i] < at[j]);
      REQUIRE((p.lane[j] >= 0 && (p.lane[j] < lanes || p.lane[j] == kBothLanes)));
      if (p.lane[j] == kBothLanes && lanes == 2) REQUIRE(splits[j]);
      if (lane0_only[j]) REQUIRE(p.lane[j] == 0);
      on_lane1 += p.lane[j] == 1;
    }
    // Independent steps with nothing else to run go on a free lane: with no dependencies at
    // all, two or more steps put one on lane 1.
    bool any_deps = false;
    for (const auto& d : deps) any_deps = any_deps || !d.empty();
    if (!any_deps && device && n >= 2 && std::count(lane0_only.begin(), lane0_only.end(), 0) >= 2)
      REQUIRE(on_lane1 > 0);
  }
}

TEST_CASE("a layer's gradients are placed on two lanes where they are independent",
          "[static][lanes]") {
  // Every step one launch, as on CUDA: the gradients of the second layer run beside the chain
  // to the first layer's.
  const std::vector<double> cost(8, 1.0);
  const std::vector<char> none(8, 0);
  const LanePlacement p = place_on_lanes(kTwoLayerBackward, cost, none, none);
  CHECK(p.lane == std::vector<int8_t>{0, 1, 1, 0, 0, 0, 1, 0});
  CHECK(p.placed == std::vector<int>{0, 3, 4, 1, 2, 5, 6, 7});
  // A large step that splits goes on both lanes when nothing can run beside it.
  const LanePlacement wide = place_on_lanes({{}, {0}}, {10, 1}, {1, 0}, {0, 0});
  CHECK(wide.lane == std::vector<int8_t>{2, 0});
  // Collectives stay on lane 0.
  const LanePlacement mpi = place_on_lanes({{}, {}}, {1, 1}, {0, 0}, {1, 1});
  CHECK(mpi.lane == std::vector<int8_t>{0, 0});
  // On three lanes the three gradients of the second layer start together; no step goes wide.
  const LanePlacement three = place_on_lanes(kTwoLayerBackward, cost, none, none, 3);
  CHECK(three.lane[1] != three.lane[2]);
  CHECK(three.lane[1] != three.lane[3]);
  CHECK(three.lane[2] != three.lane[3]);
  const LanePlacement no_wide = place_on_lanes({{}, {0}}, {10, 1}, {1, 0}, {0, 0}, 3);
  CHECK(no_wide.lane == std::vector<int8_t>{0, 0});
}
