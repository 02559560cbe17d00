// Graph launches' timelines from device spans (device_timeline.h).
#include "bench/device_timeline.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

namespace encore::bench {

namespace {

// Fills in a launch's span and busy time from its spans (by start).
void measure(LaunchTimeline& l) {
  // The union grows by whatever of each span lies past the latest end so far.
  uint64_t reached = l.spans.front().start;
  for (const DeviceSpan& s : l.spans) {
    const uint64_t from = std::max(s.start, reached);
    if (s.end > from) l.busy_ns += static_cast<int64_t>(s.end - from);
    reached = std::max(reached, s.end);
  }
  l.span_ns = static_cast<int64_t>(reached - l.spans.front().start);
}

}  // namespace

std::vector<LaunchTimeline> graph_launches(std::vector<DeviceSpan> spans) {
  std::erase_if(spans, [](const DeviceSpan& s) { return s.graph == 0 || s.end < s.start; });
  std::sort(spans.begin(), spans.end(), [](const DeviceSpan& a, const DeviceSpan& b) {
    if (a.graph != b.graph) return a.graph < b.graph;
    return a.start != b.start ? a.start < b.start : a.end < b.end;
  });
  std::vector<LaunchTimeline> launches;
  std::set<uint64_t> nodes;  // of the launch being filled
  for (size_t i = 0; i < spans.size(); ++i) {
    const DeviceSpan& s = spans[i];
    if (i == 0 || s.graph != spans[i - 1].graph || nodes.contains(s.node)) {
      launches.emplace_back();
      nodes.clear();
    }
    launches.back().spans.push_back(s);
    nodes.insert(s.node);
  }
  for (LaunchTimeline& l : launches) measure(l);
  std::sort(launches.begin(), launches.end(), [](const LaunchTimeline& a, const LaunchTimeline& b) {
    return a.spans.front().start < b.spans.front().start;
  });
  return launches;
}

int median_launch(const std::vector<LaunchTimeline>& launches) {
  std::map<uint32_t, size_t> most;  // spans of a graph's fullest launch
  for (const LaunchTimeline& l : launches) {
    size_t& m = most[l.spans.front().graph];
    m = std::max(m, l.spans.size());
  }
  std::vector<int> complete;
  for (size_t i = 0; i < launches.size(); ++i)
    if (launches[i].spans.size() == most[launches[i].spans.front().graph])
      complete.push_back(static_cast<int>(i));
  if (complete.empty()) return -1;
  const size_t mid = (complete.size() - 1) / 2;
  std::nth_element(complete.begin(), complete.begin() + static_cast<std::ptrdiff_t>(mid),
                   complete.end(),
                   [&](int a, int b) { return launches[a].span_ns < launches[b].span_ns; });
  return complete[mid];
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
