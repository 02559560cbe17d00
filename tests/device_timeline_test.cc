// The graph launches' timelines of the benchmarks' device activity (bench/device_timeline.h): the
// spans grouped by graph and launch (a node seen again starts the next launch), busy time as the
// union of overlapping spans, idle time between dependent ones, the launch of median span among
// the complete ones, and the table's lines.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "bench/device_timeline.h"

using namespace encore::bench;

namespace {

// Node `node` of graph `graph`, from `start` to `end` ns on `stream`.
DeviceSpan span(uint32_t graph, uint64_t node, uint64_t start, uint64_t end, uint32_t stream = 7,
                int name = 0) {
  return {start, end, stream, graph, node, name};
}

}  // namespace

TEST_CASE("graph launches: spans by launch, busy as their union, idle between them",
          "[bench][timeline]") {
  const std::vector<DeviceSpan> spans = {
      // graph 5, launched twice: a copy, two kernels side by side on two streams, one after a
      // wait; its second launch the same nodes later, listed out of order
      span(5, 1, 2'000, 2'500, 9, 1),
      span(5, 0, 1'000, 1'400, 7, -1),
      span(5, 2, 2'100, 3'000, 7, 0),
      span(5, 3, 4'000, 4'200, 7, 2),
      span(5, 2, 21'100, 22'000, 7, 0),
      span(5, 0, 20'000, 20'400, 7, -1),
      span(5, 3, 23'000, 23'100, 7, 2),
      span(5, 1, 21'000, 21'500, 9, 1),
      // graph 4: one kernel, between them
      span(4, 0, 10'000, 10'300),
      // an eager kernel (no graph), and a span without an end (end before start): left out
      {1'500, 1'900, 7, 0, 0, 0},
      span(4, 1, 11'000, 10'999),
  };
  const std::vector<LaunchTimeline> launches = graph_launches(spans);
  REQUIRE(launches.size() == 3);

  const LaunchTimeline& a = launches[0];  // by first start: graph 5's first
  REQUIRE(a.spans.size() == 4);
  CHECK(a.spans[0].graph == 5);
  CHECK(a.spans[0].start == 1'000);
  CHECK(a.spans[1].start == 2'000);
  CHECK(a.spans[3].start == 4'000);
  CHECK(a.span_ns == 3'200);              // 1,000 to 4,200
  CHECK(a.busy_ns == 400 + 1'000 + 200);  // [1000,1400) [2000,3000) [4000,4200)
  CHECK(a.idle_ns() == 600 + 1'000);      // 1400-2000, 3000-4000

  const LaunchTimeline& b = launches[1];  // graph 4
  REQUIRE(b.spans.size() == 1);
  CHECK(b.spans[0].graph == 4);
  CHECK(b.span_ns == 300);
  CHECK(b.busy_ns == 300);
  CHECK(b.idle_ns() == 0);

  const LaunchTimeline& c = launches[2];  // graph 5's second
  REQUIRE(c.spans.size() == 4);
  CHECK(c.spans[0].start == 20'000);
  CHECK(c.span_ns == 3'100);
  CHECK(c.busy_ns == 400 + 1'000 + 100);
  CHECK(c.idle_ns() == 600 + 1'000);

  // Nested spans: the inner one adds nothing.
  const std::vector<LaunchTimeline> nested = graph_launches(
      {span(1, 0, 0, 1'000, 7), span(1, 1, 100, 200, 8), span(1, 2, 1'500, 1'600, 7)});
  REQUIRE(nested.size() == 1);
  CHECK(nested[0].busy_ns == 1'100);
  CHECK(nested[0].idle_ns() == 500);

  CHECK(graph_launches({}).empty());
  CHECK(graph_launches({{0, 10, 1, 0, 0, 0}}).empty());
}

TEST_CASE("graph launches: the complete launch of median span", "[bench][timeline]") {
  CHECK(median_launch({}) == -1);
  // Graph 2 launched five times (two nodes each, one after the other), then cut short.
  std::vector<DeviceSpan> spans;
  const uint64_t lengths[] = {500, 100, 900, 300, 700};
  for (uint64_t i = 0; i < 5; ++i) {
    spans.push_back(span(2, 0, i * 10'000, i * 10'000 + 50));
    spans.push_back(span(2, 1, i * 10'000 + 50, i * 10'000 + lengths[i]));
  }
  spans.push_back(span(2, 0, 60'000, 60'020));  // the recording ended: a launch of one node
  std::vector<LaunchTimeline> launches = graph_launches(spans);
  REQUIRE(launches.size() == 6);
  int m = median_launch(launches);
  REQUIRE(m >= 0);
  CHECK(launches[m].span_ns == 500);     // of 500, 100, 900, 300, 700; not the 20 cut short
  launches.erase(launches.begin() + 4);  // 500, 100, 900, 300: the lower middle
  m = median_launch(launches);
  REQUIRE(m >= 0);
  CHECK(launches[m].span_ns == 300);
  CHECK(median_launch({launches.back()}) == 0);  // alone, it is its graph's fullest
}

TEST_CASE("graph launches: the timeline's lines", "[bench][timeline]") {
  const std::vector<LaunchTimeline> launches = graph_launches({
      span(2, 0, 1'000, 1'400, 40, -1),
      span(2, 1, 2'000, 3'000, 40, 0),
      span(2, 2, 2'500, 2'700, 41, 1),
      span(2, 3, 5'000, 5'250, 40, 0),
  });
  REQUIRE(launches.size() == 1);
  const std::string table = timeline_table(launches[0], {"gemm", "loss"});
  const std::string expected =
      "   start_us     dur_us    idle_us  stream  what\n"
      "       0.00       0.40       0.00       0  copy or fill\n"
      "       1.00       1.00       0.60       0  gemm\n"
      "       1.50       0.20       0.00       1  loss\n"
      "       4.00       0.25       2.00       0  gemm\n"
      "span 4.25 us, busy 1.65 us, idle 2.60 us\n";
  CHECK(table == expected);
  CHECK(timeline_table(LaunchTimeline{}, {}).empty());
}
