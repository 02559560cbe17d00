// The graph launches' timelines of the benchmarks' device activity (bench/device_timeline.h): the
// spans grouped by launch, busy time as the union of overlapping spans, idle time between
// dependent ones, the launch of median span, and the table's lines.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "bench/device_timeline.h"

using namespace encore::bench;

namespace {

// A span of a graph launch (correlation `c`), from `start` to `end` ns on `stream`.
DeviceSpan span(uint32_t c, uint64_t start, uint64_t end, uint32_t stream = 7, int name = 0) {
  return {start, end, stream, c, /*graph=*/3, name};
}

}  // namespace

TEST_CASE("graph launches: spans by launch, busy as their union, idle between them",
          "[bench][timeline]") {
  std::vector<DeviceSpan> spans = {
      // launch 5: a copy, then two kernels side by side on two streams, then one after a wait
      span(5, 2'000, 2'500, 9, 1),
      span(5, 1'000, 1'400, 7, -1),
      span(5, 2'100, 3'000, 7, 0),
      span(5, 4'000, 4'200, 7, 2),
      // launch 4 (its API call earlier, its first span later): one kernel
      span(4, 10'000, 10'300),
      // an eager kernel between them: no graph, left out
      {1'500, 1'900, 7, 6, /*graph=*/0, 0},
      // a span without an end (end before start): left out
      span(4, 11'000, 10'999),
  };
  const std::vector<LaunchTimeline> launches = graph_launches(spans);
  REQUIRE(launches.size() == 2);

  const LaunchTimeline& a = launches[0];  // by first start: launch 5
  REQUIRE(a.spans.size() == 4);
  CHECK(a.spans[0].correlation == 5);
  CHECK(a.spans[0].start == 1'000);
  CHECK(a.spans[1].start == 2'000);
  CHECK(a.spans[3].start == 4'000);
  CHECK(a.span_ns == 3'200);              // 1,000 to 4,200
  CHECK(a.busy_ns == 400 + 1'000 + 200);  // [1000,1400) [2000,3000) [4000,4200)
  CHECK(a.idle_ns() == 600 + 1'000);      // 1400-2000, 3000-4000

  const LaunchTimeline& b = launches[1];
  REQUIRE(b.spans.size() == 1);
  CHECK(b.span_ns == 300);
  CHECK(b.busy_ns == 300);
  CHECK(b.idle_ns() == 0);

  // Nested spans: the inner one adds nothing.
  const std::vector<LaunchTimeline> nested =
      graph_launches({span(1, 0, 1'000, 7), span(1, 100, 200, 8), span(1, 1'500, 1'600, 7)});
  REQUIRE(nested.size() == 1);
  CHECK(nested[0].busy_ns == 1'100);
  CHECK(nested[0].idle_ns() == 500);

  CHECK(graph_launches({}).empty());
  CHECK(graph_launches({{0, 10, 1, 1, /*graph=*/0, 0}}).empty());
}

TEST_CASE("graph launches: the launch of median span", "[bench][timeline]") {
  CHECK(median_launch({}) == -1);
  std::vector<DeviceSpan> spans;
  const uint64_t lengths[] = {500, 100, 900, 300, 700};
  for (uint32_t c = 0; c < 5; ++c) spans.push_back(span(c, c * 10'000, c * 10'000 + lengths[c]));
  std::vector<LaunchTimeline> launches = graph_launches(spans);
  int m = median_launch(launches);
  REQUIRE(m >= 0);
  CHECK(launches[m].span_ns == 500);
  launches.pop_back();  // 500, 100, 900, 300: the lower middle
  m = median_launch(launches);
  REQUIRE(m >= 0);
  CHECK(launches[m].span_ns == 300);
}

TEST_CASE("graph launches: the timeline's lines", "[bench][timeline]") {
  const std::vector<LaunchTimeline> launches = graph_launches({
      span(2, 1'000, 1'400, 40, -1),
      span(2, 2'000, 3'000, 40, 0),
      span(2, 2'500, 2'700, 41, 1),
      span(2, 5'000, 5'250, 40, 0),
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
