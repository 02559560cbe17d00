// Helpers of the CUDA tests: the device, scopes that set the CUDA-graph switch and keep the
// generators' state, and a test case run with graphs on and off. Host copies and bitwise comparison
// of tensors on any device (bit_diff, check_same_parameters, on_host) are in test_util.h.
#pragma once

#include "encore/encore.h"
#include "runtime/cuda.h"
#include "tests/test_util.h"

namespace encore::testing {

inline constexpr Device kCuda = Device::cuda(0);

// Sets whether static replay on CUDA uses CUDA graphs for a scope.
using GraphsEnabled = SwitchScope<cuda::set_graphs_enabled>;

// Runs scenario(graphs) in a test case that Catch runs twice (a GENERATE): with static replay on
// CUDA as CUDA graphs (graphs true), then launch by launch.
template <typename Scenario>
void with_graphs_on_and_off(Scenario&& scenario) {
  const bool graphs = GENERATE(true, false);
  INFO("CUDA graphs " << (graphs ? "on" : "off"));
  GraphsEnabled use_graphs(graphs);
  scenario(graphs);
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
