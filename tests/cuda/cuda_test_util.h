// Helpers of the CUDA tests: the device, a copy on a given stream, scopes that set the CUDA-graph
// switch and keep the generators' state, a test case run with graphs on and off, and the check of
// how a cache entry's replays used CUDA graphs. Host copies and bitwise comparison of tensors on
// any device (bit_diff, check_same_parameters, on_host) are in test_util.h.
#pragma once

#include <cstdint>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "runtime/cuda.h"
#include "tests/test_util.h"

namespace encore::testing {

inline constexpr Device kCuda = Device::cuda(0);

// Copies `from` into `to` (same size) on stream `s` of cuda:0.
inline void copy_on(cuda::StreamHandle s, const Tensor& to, const Tensor& from) {
  const cuda::StreamGuard on(kCuda.index, s);
  cuda::copy_bytes(to.raw_data(), kCuda, from.raw_data(), kCuda, from.nbytes());
}

// Sets whether static replay on CUDA uses CUDA graphs for a scope.
using GraphsEnabled = SwitchScope<cuda::set_graphs_enabled>;
// Sets whether those graphs read arguments whose addresses repeat where they are, for a scope.
using GraphDirectArguments = SwitchScope<schedule::set_graph_direct_arguments_enabled>;

// How the CUDA plans of a scope replayed (every plan of the process, counted from the scope's
// start): with graphs on, as graph launches only (a failed capture falls back to a bit-identical
// stream replay, so a scenario that compares bits alone would pass without any graph), but for
// captures put off while a cuBLASLt plan is missing, which replay on the stream that makes it; with
// graphs off, on the stream only. `replays`: whether the scope replays anything at all (an eager
// scenario does not).
class CheckGraphUse {
 public:
  explicit CheckGraphUse(bool graphs, bool replays = true)
      : graphs_(graphs), replays_(replays), before_(schedule::graph_use_counts()) {}
  void check() const {
    const schedule::GraphUseCounts now = schedule::graph_use_counts();
    const int64_t launches = now.launches - before_.launches,
                  captures = now.captures - before_.captures,
                  stream = now.stream_replays - before_.stream_replays,
                  fallbacks = now.fallbacks - before_.fallbacks,
                  deferred = now.deferred - before_.deferred,
                  verified = now.verified - before_.verified;
    INFO("graph launches " << launches << ", captures " << captures << ", stream replays " << stream
                           << " (of them deferred captures " << deferred << ", verified "
                           << verified << "), failed captures " << fallbacks);
    CHECK(fallbacks == 0);
    if (!replays_) {
      CHECK(launches + stream == 0);
    } else if (graphs_) {
      // only captures put off until a library plan exists, and replays checked against eager
      CHECK(stream == deferred + verified);
      CHECK(launches > 0);
      CHECK(captures >= 1);
    } else {
      CHECK(launches == 0);
      CHECK(captures == 0);
      CHECK(stream > 0);
    }
  }

 private:
  bool graphs_, replays_;
  schedule::GraphUseCounts before_;
};

// Runs scenario(graphs) in a test case that Catch runs twice (a GENERATE): with static replay on
// CUDA as CUDA graphs (graphs true), then launch by launch; then checks that the replays ran
// that way (CheckGraphUse; `replays` false: a scenario that replays nothing).
template <typename Scenario>
void with_graphs_on_and_off(Scenario&& scenario, bool replays = true) {
  const bool graphs = GENERATE(true, false);
  INFO("CUDA graphs " << (graphs ? "on" : "off"));
  GraphsEnabled use_graphs(graphs);
  const CheckGraphUse use(graphs, replays);
  scenario(graphs);
  use.check();
}

// How a cache entry's replays ran: with graphs on, every replayed phase was one graph launch (a
// forward per hit, and a backward when the schedule has one) and nothing fell back; with graphs
// off, none was.
inline void check_graph_use(const EntryReport& e, bool graphs, int64_t hits) {
  INFO("entry " << e.signature << ": " << e.graph_text());
  if (graphs) {
    CHECK(e.graph_fallback == "");
    CHECK(e.graph_capture_failures == 0);
    CHECK(e.stream_replays == 0);
    CHECK(e.graph_launches >= hits);
    CHECK(e.graph_launches <= 2 * hits);
    CHECK(e.graph_captures >= 1);
    CHECK(e.graph_captures <= e.graph_launches);
  } else {
    CHECK(e.graph_launches == 0);
    CHECK(e.graph_captures == 0);
    CHECK(e.stream_replays >= hits);
  }
}

// Restores the cpu's and cuda:0's generators when the scope ends.
class KeepGenerators {
 public:
  KeepGenerators()
      : cpu_(default_generator(Device::cpu()).state()), cuda_(default_generator(kCuda).state()) {}
  ~KeepGenerators() {
    default_generator(Device::cpu()).set_state(cpu_);
    default_generator(kCuda).set_state(cuda_);
  }
  KeepGenerators(const KeepGenerators&) = delete;
  KeepGenerators& operator=(const KeepGenerators&) = delete;

 private:
  Generator::Stream cpu_, cuda_;
};

}  // namespace encore::testing
