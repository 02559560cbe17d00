// Helpers of the CUDA tests: host copies for bitwise comparison (test_util.h reads bytes on the
// host), parameter comparison across a model on the device, and scopes that set the CUDA-graph
// switch and keep the generators' state.
#pragma once

#include <catch2/catch.hpp>
#include <string>

#include "encore/encore.h"
#include "runtime/cuda.h"
#include "tests/test_util.h"

namespace encore::testing {

inline constexpr Device kCuda = Device::cuda(0);

// A cpu copy of t's bytes, made without an op or autograd (t itself when on the cpu; undefined
// stays undefined). Waits for the device's stream.
inline Tensor on_host(const Tensor& t) {
  if (!t.defined() || t.device().type == DeviceType::CPU) return t;
  Tensor h = Tensor::empty(t.shape(), t.dtype(), Device::cpu());
  if (t.nbytes() > 0)
    cuda::copy_bytes(h.raw_data(), Device::cpu(), t.raw_data(), t.device(), t.nbytes());
  return h;
}

// bit_diff of the host copies, after checking that both live on one device.
inline std::string host_bit_diff(const Tensor& a, const Tensor& b) {
  if (a.defined() && b.defined() && a.device() != b.device())
    return cat("devices differ: ", a.device(), " vs ", b.device());
  return bit_diff(on_host(a), on_host(b));
}

// check_same_parameters for models on any device: every parameter and gradient of `a` equals
// `b`'s bit for bit, on the same device.
inline void check_same_parameters_on_host(const nn::Module& a, const nn::Module& b,
                                          const std::string& when) {
  const auto pa = a.named_parameters();
  const auto pb = b.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO(when << ": parameter " << pa[i].first << " / " << pb[i].first);
    CHECK(host_bit_diff(pa[i].second, pb[i].second) == "");
    CHECK(host_bit_diff(pa[i].second.grad(), pb[i].second.grad()) == "");
  }
}

// Sets whether static replay on CUDA uses CUDA graphs for a scope.
class GraphsEnabled {
 public:
  explicit GraphsEnabled(bool on) : previous_(cuda::set_graphs_enabled(on)) {}
  ~GraphsEnabled() { cuda::set_graphs_enabled(previous_); }
  GraphsEnabled(const GraphsEnabled&) = delete;
  GraphsEnabled& operator=(const GraphsEnabled&) = delete;

 private:
  bool previous_;
};

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
