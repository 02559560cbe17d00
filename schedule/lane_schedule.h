// The two-lane list schedule of a phase's dependency graph, and the order in which a CUDA graph's
// capture queues the steps on two streams (lanes.cc builds the graph from the plan and uses
// both). Kept apart from the plan so that their promises are tested on their own
// (lane_schedule_test.cc): the placement is an order that keeps every dependency, and the queue
// keeps every dependency, by one stream's order or by a mark, with no wait that a stream's order
// implies already.
#pragma once

#include <cstdint>
#include <vector>

namespace encore::schedule {

// Where the steps of a phase go: lane[j] is 0, 1 or 2 (both lanes: a wide step), and `placed`
// the steps in the order they were placed, each after the steps it depends on.
struct LanePlacement {
  std::vector<int8_t> lane;
  std::vector<int> placed;
};

// List scheduling of steps 0 to n-1, where deps[j] are the earlier steps j must follow: the
// ready step with the longest remaining path (at cost[j] per step) is placed next, on the lane
// where it can start first (lane 0 when lane0_only[j], for a step that does not split). A step
// that `splits` goes on both lanes (at cost / kWideSpeedup), unless a ready step of at least half
// its cost can run beside it: then both go on one lane each.
constexpr double kWideSpeedup = 1.8;  // what a wide step's second thread is worth
LanePlacement place_on_lanes(const std::vector<std::vector<int>>& deps,
                             const std::vector<double>& cost, const std::vector<char>& splits,
                             const std::vector<char>& lane0_only);

// One step as queued: the stream of its lane (0: the capture's, 1: its branch), the mark its
// stream waits for before it (-1: none) and the mark set on its stream after it (-1: none).
struct GraphEntry {
  int32_t step = 0;
  int8_t stream = 0;
  int32_t after = -1, mark = -1;
};

// `placed`: steps 0 to n-1 in an order in which each comes after the steps deps[j] it depends
// on; lane[j] is 0 or 1. The entries in that order, each waiting only for the latest step of the
// other lane it depends on, and only when its stream does not wait for that one, or a later one,
// already; `marks` gets the number of marks they set.
std::vector<GraphEntry> queue_on_streams(const std::vector<std::vector<int>>& deps,
                                         const std::vector<int8_t>& lane,
                                         const std::vector<int>& placed, int& marks);

}  // namespace encore::schedule
