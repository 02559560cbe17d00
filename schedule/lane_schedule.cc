// The two-lane list schedule and the two-stream queue order (lane_schedule.h).
#include "schedule/lane_schedule.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace encore::schedule {

LanePlacement place_on_lanes(const std::vector<std::vector<int>>& deps,
                             const std::vector<double>& cost, const std::vector<char>& splits,
                             const std::vector<char>& lane0_only) {
  const int count = static_cast<int>(deps.size());
  std::vector<std::vector<int>> users(count);
  for (int j = 0; j < count; ++j)
    for (int i : deps[j]) users[i].push_back(j);
  // The longest path from each step to the end (itself included, at its cost split).
  auto split_cost = [&](int j) { return splits[j] ? cost[j] / kWideSpeedup : cost[j]; };
  std::vector<double> rank(count, 0);
  for (int j = count - 1; j >= 0; --j) {
    double tail = 0;
    for (int u : users[j]) tail = std::max(tail, rank[u]);
    rank[j] = split_cost(j) + tail;
  }
  // Per lane the time it is free, per step when it ends.
  LanePlacement out;
  out.lane.assign(count, 0);
  out.placed.reserve(count);
  double free_at[2] = {0, 0};
  std::vector<double> ends(count, 0);
  std::vector<int> waiting(count);
  std::vector<char> beside(count, 0);  // placed on one lane, beside a large step
  std::vector<int> ready;
  for (int j = 0; j < count; ++j)
    if ((waiting[j] = static_cast<int>(deps[j].size())) == 0) ready.push_back(j);
  while (!ready.empty()) {
    auto first = std::min_element(ready.begin(), ready.end(), [&](int a, int b) {
      return rank[a] != rank[b] ? rank[a] > rank[b] : a < b;
    });
    const int j = *first;
    ready.erase(first);
    double inputs = 0;
    for (int i : deps[j]) inputs = std::max(inputs, ends[i]);
    // A large step goes on both lanes, unless another ready step of at least half its cost can
    // run beside it (two steps side by side keep both threads busier than one split): then both
    // go on one lane each.
    bool wide = splits[j] && !beside[j];
    if (wide)
      for (int k : ready)
        if (2 * cost[k] >= cost[j]) {
          wide = false;
          beside[k] = 1;
          break;
        }
    int lane = 2;
    double start = std::max({inputs, free_at[0], free_at[1]});
    if (!wide) {
      const double at0 = std::max(inputs, free_at[0]), at1 = std::max(inputs, free_at[1]);
      lane = at1 < at0 && !lane0_only[j] ? 1 : 0;
      start = lane == 1 ? at1 : at0;
    }
    ends[j] = start + (wide ? split_cost(j) : cost[j]);
    for (int l = 0; l < 2; ++l)
      if (lane == 2 || lane == l) free_at[l] = ends[j];
    out.lane[j] = static_cast<int8_t>(lane);
    out.placed.push_back(j);
    for (int u : users[j])
      if (--waiting[u] == 0) ready.push_back(u);
  }
  return out;
}

std::vector<GraphEntry> queue_on_streams(const std::vector<std::vector<int>>& deps,
                                         const std::vector<int8_t>& lane,
                                         const std::vector<int>& placed, int& marks) {
  const int count = static_cast<int>(placed.size());
  std::vector<GraphEntry> order;
  order.reserve(count);
  marks = 0;
  std::vector<int> at(count);  // each step's place in the queue
  for (int p = 0; p < count; ++p) at[placed[p]] = p;
  // Per stream, the last place of the other lane it waits for: a stream runs its steps in queue
  // order, so waiting for a place waits for every earlier one of that lane.
  int follows[2] = {-1, -1};
  for (int p = 0; p < count; ++p) {
    const int j = placed[p];
    GraphEntry e;
    e.step = j;
    e.stream = lane[j];
    int latest = -1;  // the last place of the other lane among j's dependencies
    for (int i : deps[j])
      if (lane[i] != lane[j]) latest = std::max(latest, at[i]);
    if (latest > follows[e.stream]) {
      follows[e.stream] = latest;
      GraphEntry& producer = order[latest];
      if (producer.mark < 0) producer.mark = marks++;
      e.after = producer.mark;
    }
    order.push_back(e);
  }
  return order;
}

}  // namespace encore::schedule
