// Where a graph launch's device time goes between its kernels: from each kernel's, copy's and
// fill's start and end on the device (bench/device_activity.h records them), the time from the
// launch's first start to its last end (its span) against the time the device ran any of them
// (busy). What is neither is the device waiting: a kernel that may start only once the one before
// it ended, and the launch latency between them, on the launch's critical path. A replay whose
// span is mostly busy gains by faster kernels; one with much idle time by fewer kernels in a row.
//
//   std::vector<LaunchTimeline> launches = graph_launches(activity.spans);
//   timeline_table(launches[median_launch(launches)], activity.names);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace encore::bench {

// One kernel, copy or fill as the device ran it.
struct DeviceSpan {
  uint64_t start = 0, end = 0;  // ns on the device's clock, end >= start
  uint32_t stream = 0;          // CUPTI's stream id
  uint32_t graph = 0;           // the graph it ran in (0: not a graph's node)
  uint64_t node = 0;            // its node in that graph
  int name = -1;                // an index into the names of its kernels; -1 for a copy or fill
};

// The spans of one graph launch, by start (then end), with its span and busy time.
struct LaunchTimeline {
  std::vector<DeviceSpan> spans;
  int64_t span_ns = 0;  // first start to last end
  int64_t busy_ns = 0;  // the union of the spans' [start, end)
  int64_t idle_ns() const { return span_ns - busy_ns; }
};

// The graph launches among `spans`, by their first start: a graph's spans by start, a launch
// ending where a node comes again (the launches of one graph run one after another, on the
// stream they were launched on; CUPTI's correlation ids, which should tell them apart, are
// wrong for graph launches after the first profiling session in CUDA 13.0's CUPTI). Spans
// outside graphs (eager kernels, copies on the stream) are left out.
std::vector<LaunchTimeline> graph_launches(std::vector<DeviceSpan> spans);

// The index of the launch whose span is the median of the complete ones among `launches` (the
// lower one of an even count): those with as many spans as the most any launch of their graph
// has, so a launch cut short by the end of a recording (or by records CUPTI dropped) is not
// counted. -1 when there is none.
int median_launch(const std::vector<LaunchTimeline>& launches);

// One launch, a line per span in start order: its start after the launch's first, its duration,
// the device's idle time just before it (since the latest end of the spans before it, when that
// is earlier than its start), its stream (numbered 0, 1, ... in order of first use) and what it
// was ("copy or fill", or names[name]). Then the span, busy and idle times.
std::string timeline_table(const LaunchTimeline& launch, const std::vector<std::string>& names);

}  // namespace encore::bench
