// What a CUDA kernel resolves once per call site shape and keeps for the process: a
// convolution's cuDNN descriptors and algorithm (conv.cc), a linear's cuBLASLt algorithm
// (blas_lt.cc).
//
//   static auto* plans = new PlanCache<Key, Plan>;  // never destroyed
//   Plan& p = plans->find_or_make(key, [&] { return make_plan(...); });
//
// Plans are found under a lock and never move or die (a static plan's step keeps a pointer in
// its KernelArgs::state, and work may still be queued at exit).
#pragma once

#include <memory>
#include <mutex>

#include "absl/container/flat_hash_map.h"

namespace encore::kernels::cuda {

template <typename Key, typename Plan>
class PlanCache {
 public:
  // The plan of `key`; make() (returning std::unique_ptr<Plan>) makes it on first use, under the
  // lock. An exception from make() leaves no plan.
  template <typename Make>
  Plan& find_or_make(const Key& key, Make&& make) {
    const std::lock_guard<std::mutex> lock(mu_);
    auto it = plans_.find(key);
    if (it == plans_.end()) it = plans_.emplace(key, make()).first;
    return *it->second;
  }

 private:
  std::mutex mu_;
  absl::flat_hash_map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace encore::kernels::cuda
