// The lane list schedule and the stream queue order (lane_schedule.h).
#include "schedule/lane_schedule.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "runtime/error.h"

namespace encore::schedule {

LanePlacement place_on_lanes(const std::vector<std::vector<int>>& deps,
                             const std::vector<double>& cost, const std::vector<char>& splits,
                             const std::vector<char>& lane0_only, int lanes) {
  ENCORE_CHECK(lanes >= 2 && lanes <= kMaxLanes, "place_on_lanes: ", lanes, " lanes (2 to ",
               kMaxLanes, ")");
  const int count = static_cast<int>(deps.size());
  std::vector<std::vector<int>> users(count);
  for (int j = 0; j < count; ++j)
    for (int i : deps[j]) users[i].push_back(j);
  // A step splits across both lanes of a two-lane schedule only.
  auto wide_ok = [&](int j) { return lanes == 2 && splits[j]; };
  // The longest path from each step to the end (itself included, at its cost split).
  auto split_cost = [&](int j) { return wide_ok(j) ? cost[j] / kWideSpeedup : cost[j]; };
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
  std::array<double, kMaxLanes> free_at{};
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
    bool wide = wide_ok(j) && !beside[j];
    if (wide)
      for (int k : ready)
        if (2 * cost[k] >= cost[j]) {
          wide = false;
          beside[k] = 1;
          break;
        }
    int lane = kBothLanes;
    double start = std::max({inputs, free_at[0], free_at[1]});
    if (!wide) {
      lane = 0;
      start = std::max(inputs, free_at[0]);
      for (int l = 1; l < lanes && !lane0_only[j]; ++l)
        if (const double at = std::max(inputs, free_at[l]); at < start) {
          lane = l;
          start = at;
        }
    }
    ends[j] = start + (wide ? split_cost(j) : cost[j]);
    for (int l = 0; l < lanes; ++l)
      if (lane == l || (wide && l < 2)) free_at[l] = ends[j];
    out.lane[j] = static_cast<int8_t>(lane);
    out.placed.push_back(j);
    for (int u : users[j])
      if (--waiting[u] == 0) ready.push_back(u);
  }
  return out;
}

StreamQueue queue_on_streams(const std::vector<std::vector<int>>& deps,
                             const std::vector<int8_t>& lane, const std::vector<int>& placed,
                             int streams) {
  ENCORE_CHECK(streams >= 1 && streams <= kMaxLanes, "queue_on_streams: ", streams,
               " streams (1 to ", kMaxLanes, ")");
  const int count = static_cast<int>(placed.size());
  StreamQueue q;
  q.entries.reserve(count);
  std::vector<int> at(count);  // each step's place in the queue
  for (int p = 0; p < count; ++p) at[placed[p]] = p;
  // What the device orders before a stream's next step, as a vector clock: knows[s][t] is the
  // last place of stream t it follows (-1: none), and once stream t follows a place, it follows
  // every earlier place of t (a stream runs its steps in queue order). after[p] is that of the
  // stream of place p right after it, which a wait for p's mark brings along.
  using Clock = std::array<int, kMaxLanes>;
  Clock none;
  none.fill(-1);
  std::vector<Clock> knows(streams, none), after(count, none);
  for (int p = 0; p < count; ++p) {
    const int j = placed[p];
    const int s = lane[j];
    ENCORE_CHECK(s >= 0 && s < streams, "queue_on_streams: step ", j, " is on lane ", s, " of ",
                 streams, " streams");
    q.streams = std::max(q.streams, s + 1);
    // The latest place of each other stream among j's dependencies, latest first: a wait for a
    // later place may bring an earlier one along, never the other way round.
    Clock latest = none;
    for (int i : deps[j])
      if (lane[i] != s) latest[lane[i]] = std::max(latest[lane[i]], at[i]);
    std::sort(latest.begin(), latest.end(), [](int a, int b) { return a > b; });
    GraphEntry e;
    e.step = j;
    e.stream = static_cast<int8_t>(s);
    e.waits_begin = static_cast<uint32_t>(q.waits.size());
    for (const int c : latest) {
      if (c < 0 || c <= knows[s][lane[placed[c]]]) continue;  // none, or followed already
      GraphEntry& producer = q.entries[c];
      if (producer.mark < 0) producer.mark = q.marks++;
      q.waits.push_back(producer.mark);
      for (int u = 0; u < streams; ++u) knows[s][u] = std::max(knows[s][u], after[c][u]);
    }
    e.waits_end = static_cast<uint32_t>(q.waits.size());
    knows[s][s] = p;
    after[p] = knows[s];
    q.entries.push_back(e);
  }
  return q;
}

}  // namespace encore::schedule
