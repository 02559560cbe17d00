// Graph launches' timelines from device spans (device_timeline.h).
#include "bench/device_timeline.h"

#include <algorithm>
#include <cstdio>
#include <map>

namespace encore::bench {

std::vector<LaunchTimeline> graph_launches(std::vector<DeviceSpan> spans) {
  std::erase_if(spans, [](const DeviceSpan& s) { return s.graph == 0 || s.end < s.start; });
  std::sort(spans.begin(), spans.end(), [](const DeviceSpan& a, const DeviceSpan& b) {
    if (a.correlation != b.correlation) return a.correlation < b.correlation;
    return a.start != b.start ? a.start < b.start : a.end < b.end;
  });
  std::vector<LaunchTimeline> launches;
  for (size_t i = 0; i < spans.size();) {
    LaunchTimeline& l = launches.emplace_back();
    size_t j = i;
    while (j < spans.size() && spans[j].correlation == spans[i].correlation) ++j;
    l.spans.assign(spans.begin() + static_cast<std::ptrdiff_t>(i),
                   spans.begin() + static_cast<std::ptrdiff_t>(j));
    // Spans by start: the union grows by whatever of each lies past the latest end so far.
    uint64_t reached = l.spans.front().start, last_end = reached;
    for (const DeviceSpan& s : l.spans) {
      const uint64_t from = std::max(s.start, reached);
      if (s.end > from) l.busy_ns += static_cast<int64_t>(s.end - from);
      reached = std::max(reached, s.end);
      last_end = std::max(last_end, s.end);
    }
    l.span_ns = static_cast<int64_t>(last_end - l.spans.front().start);
    i = j;
  }
  std::sort(launches.begin(), launches.end(), [](const LaunchTimeline& a, const LaunchTimeline& b) {
    return a.spans.front().start < b.spans.front().start;
  });
  return launches;
}

int median_launch(const std::vector<LaunchTimeline>& launches) {
  if (launches.empty()) return -1;
  std::vector<int> order(launches.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  const size_t mid = (order.size() - 1) / 2;
  std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(mid), order.end(),
                   [&](int a, int b) { return launches[a].span_ns < launches[b].span_ns; });
  return order[mid];
}

std::string timeline_table(const LaunchTimeline& launch, const std::vector<std::string>& names) {
  if (launch.spans.empty()) return "";
  std::string out = "   start_us     dur_us    idle_us  stream  what\n";
  std::map<uint32_t, int> stream_index;
  const uint64_t first = launch.spans.front().start;
  uint64_t reached = first;
  char line[96];
  auto us = [](uint64_t ns) { return static_cast<double>(ns) * 1e-3; };
  for (const DeviceSpan& s : launch.spans) {
    const int stream =
        stream_index.try_emplace(s.stream, static_cast<int>(stream_index.size())).first->second;
    const uint64_t idle = s.start > reached ? s.start - reached : 0;
    std::snprintf(line, sizeof line, "%11.2f %10.2f %10.2f %7d  ", us(s.start - first),
                  us(s.end - s.start), us(idle), stream);
    out += line;
    out +=
        s.name >= 0 && static_cast<size_t>(s.name) < names.size() ? names[s.name] : "copy or fill";
    out += '\n';
    reached = std::max(reached, s.end);
  }
  std::snprintf(line, sizeof line, "span %.2f us, busy %.2f us, idle %.2f us\n",
                us(static_cast<uint64_t>(launch.span_ns)),
                us(static_cast<uint64_t>(launch.busy_ns)),
                us(static_cast<uint64_t>(launch.idle_ns())));
  out += line;
  return out;
}

}  // namespace encore::bench
