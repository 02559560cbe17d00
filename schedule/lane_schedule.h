// The lane list schedule of a phase's dependency graph, and the order in which a CUDA graph's
// capture queues the steps on its streams (lanes.cc builds the graph from the plan and uses
// both). Kept apart from the plan so that their promises are tested on their own
// (lane_schedule_test.cc): the placement is an order that keeps every dependency, and the queue
// keeps every dependency, by one stream's order or by marks, with no wait that the streams'
// order implies already.
#pragma once

#include <cstdint>
#include <vector>

namespace encore::schedule {

// The most lanes a schedule has (a CUDA graph's streams).
constexpr int kMaxLanes = 4;
// A wide step's lane: on both lanes of a two-lane schedule.
constexpr int8_t kBothLanes = 2;

// Where the steps of a phase go: lane[j] is a lane below `lanes` (or, with two lanes only,
// kBothLanes), and `placed` the steps in the order they were placed, each after the steps it
// depends on.
struct LanePlacement {
  std::vector<int8_t> lane;
  std::vector<int> placed;
};

// List scheduling of steps 0 to n-1 on `lanes` lanes (2 to kMaxLanes), where deps[j] are the
// earlier steps j must follow: the ready step with the longest remaining path (at cost[j] per
// step) is placed next, on the lane where it can start first, the lowest such (lane 0 when
// lane0_only[j], for a step that does not split). With two lanes, a step that `splits` goes on
// both (kBothLanes, at cost / kWideSpeedup), unless a ready step of at least half its cost can
// run beside it: then both go on one lane each. With more, no step splits.
constexpr double kWideSpeedup = 1.8;  // what a wide step's second thread is worth
LanePlacement place_on_lanes(const std::vector<std::vector<int>>& deps,
                             const std::vector<double>& cost, const std::vector<char>& splits,
                             const std::vector<char>& lane0_only, int lanes = 2);

// One step as queued: the stream of its lane (0: the capture's, others its branches), the marks
// its stream waits for before it (waits[waits_begin, waits_end) of its StreamQueue), and the
// mark set on its stream after it (-1: none).
struct GraphEntry {
  int32_t step = 0;
  int8_t stream = 0;
  uint32_t waits_begin = 0, waits_end = 0;
  int32_t mark = -1;
};
struct StreamQueue {
  std::vector<GraphEntry> entries;
  std::vector<int32_t> waits;
  int marks = 0;    // marks 0 to marks - 1, each set once
  int streams = 0;  // the streams the entries use: 0 to streams - 1
};

// `placed`: steps 0 to n-1 in an order in which each comes after the steps deps[j] it depends
// on; lane[j] is below `streams` (at most kMaxLanes). The entries in that order, each waiting
// for the latest step of every other stream it depends on, unless its stream follows that step,
// or a later one of that stream, already (through its own waits or the waits of the steps it
// follows), and for no more: a wait a later one implies is left out.
StreamQueue queue_on_streams(const std::vector<std::vector<int>>& deps,
                             const std::vector<int8_t>& lane, const std::vector<int>& placed,
                             int streams);

}  // namespace encore::schedule
