// Helpers shared by the tests: host copies, bitwise tensor comparison (on any device),
// parameter comparison, the message of a thrown Error, and scopes that turn static graphs and
// their elementwise fusion on or off.
#pragma once

#include <catch2/catch.hpp>
#include <cstring>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "encore/encore.h"
#include "runtime/cuda.h"

namespace encore::testing {

// A new cpu tensor holding a copy of t's bytes, made without an op or autograd (undefined stays
// undefined). Waits for the stream of t's device.
inline Tensor on_host(const Tensor& t) {
  if (!t.defined()) return t;
  Tensor h = Tensor::empty(t.shape(), t.dtype(), Device::cpu());
  cuda::copy_bytes(h.raw_data(), Device::cpu(), t.raw_data(), t.device(), t.nbytes());
  return h;
}

// "" when a and b live on one device and hold the same bits; otherwise what differs (the first
// differing element). Tensors on a device are compared through host copies.
inline std::string bit_diff(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined())
    return a.defined() == b.defined()
               ? ""
               : cat("one tensor is undefined: ", a.defined(), " vs ", b.defined());
  if (a.device() != b.device()) return cat("devices differ: ", a.device(), " vs ", b.device());
  if (a.device().type != DeviceType::CPU) return bit_diff(on_host(a), on_host(b));
  if (!(a.shape() == b.shape())) return cat("shapes differ: ", a.shape(), " vs ", b.shape());
  if (a.dtype() != b.dtype()) return cat("dtypes differ: ", a.dtype(), " vs ", b.dtype());
  if (std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0) return "";
  const int64_t n = a.numel();
  for (int64_t i = 0; i < n; ++i) {
    if (a.dtype() == DType::Float32) {
      const float x = static_cast<const float*>(a.raw_data())[i];
      const float y = static_cast<const float*>(b.raw_data())[i];
      if (std::memcmp(&x, &y, sizeof x) != 0)
        return cat("element ", i, " of ", n, " differs: ", x, " vs ", y);
    } else if (a.dtype() == DType::Float64) {
      const double x = static_cast<const double*>(a.raw_data())[i];
      const double y = static_cast<const double*>(b.raw_data())[i];
      if (std::memcmp(&x, &y, sizeof x) != 0)
        return cat("element ", i, " of ", n, " differs: ", x, " vs ", y);
    }
  }
  return "bytes differ";
}

// Compares every parameter (and its gradient) of two models of the same structure, on one device.
inline void check_same_parameters(const nn::Module& a, const nn::Module& b,
                                  const std::string& when) {
  const auto pa = a.named_parameters();
  const auto pb = b.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO(when << ": parameter " << pa[i].first << " / " << pb[i].first);
    CHECK(bit_diff(pa[i].second, pb[i].second) == "");
    CHECK(bit_diff(pa[i].second.grad(), pb[i].second.grad()) == "");
  }
}

// The message of the encore::Error `fn` throws ("" when it throws nothing).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Sets a process-wide switch for a scope and restores the previous setting at its end; `Set`
// returns the previous setting.
template <bool (*Set)(bool)>
class SwitchScope {
 public:
  explicit SwitchScope(bool on) : previous_(Set(on)) {}
  ~SwitchScope() { Set(previous_); }
  SwitchScope(const SwitchScope&) = delete;
  SwitchScope& operator=(const SwitchScope&) = delete;

 private:
  bool previous_;
};

// Captures what the static graphs log for a scope.
class LogCapture {
 public:
  LogCapture() : old_(set_log_sink([this](const std::string& l) { lines.push_back(l); })) {}
  ~LogCapture() { set_log_sink(old_); }
  std::vector<std::string> lines;

 private:
  LogSink old_;
};

// Turns static graphs on for a test (ENCORE_STATIC=0 in the environment would turn them off).
struct StaticEnabled : SwitchScope<set_static_enabled> {
  explicit StaticEnabled(bool on = true) : SwitchScope(on) {}
};

// Sets whether static functions traced in the scope guard their arena blocks with red zones
// (those replay in order: tests of two-lane replay turn them off).
using StaticRedzones = SwitchScope<set_static_redzones_enabled>;

// Sets the number of threads for a scope and restores the previous number at its end.
class ThreadCount {
 public:
  explicit ThreadCount(int n) : saved_(num_threads()) { set_num_threads(n); }
  ~ThreadCount() { set_num_threads(saved_); }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;

 private:
  int saved_;
};

// Sets whether static functions traced in the scope fuse elementwise steps (ENCORE_STATIC_FUSE=0
// in the environment would turn fusion off).
using StaticFusion = SwitchScope<set_static_fusion_enabled>;

// Sets whether static functions traced in the scope fold activations into their producers and
// run max pooling before a ReLU (ENCORE_STATIC_FOLD=0 in the environment would turn it off).
using StaticFoldActivations = SwitchScope<set_static_fold_activations_enabled>;
// Sets whether static functions traced in the scope fold the steps computing constants
// (ENCORE_STATIC_FOLD_CONSTANTS=0 in the environment would turn it off).
using StaticFoldConstants = SwitchScope<set_static_fold_constants_enabled>;
// Sets whether static functions traced in the scope fold chains of layout steps into strided
// copies (ENCORE_STATIC_FOLD_LAYOUTS=0 in the environment would turn it off).
using StaticFoldLayouts = SwitchScope<set_static_fold_layouts_enabled>;
// Sets whether static functions traced in the scope fold a linear's Adam updates into its
// gradients' step on the cpu too (off by default; ENCORE_STATIC_FOLD_CPU_UPDATES=1 would start it
// on).
using StaticFoldCpuUpdates = SwitchScope<set_static_fold_cpu_updates_enabled>;

// How many matches of the regular expression `pattern` `text` holds (a schedule dump's steps).
inline int count_of(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  return static_cast<int>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

// Whether one of `lines` contains `part`.
inline bool any_contains(const std::vector<std::string>& lines, const std::string& part) {
  for (const std::string& l : lines)
    if (l.find(part) != std::string::npos) return true;
  return false;
}

// The lines, each ended by a newline (for INFO).
inline std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += l + "\n";
  return s;
}

}  // namespace encore::testing
