// What a CUDA kernel resolves once per call site shape and keeps for the process: a
// convolution's cuDNN descriptors and algorithm (conv.cc), a linear's cuBLASLt algorithm
// (blas_lt.cc).
//
//   static auto* plans = new PlanCache<Key, Plan>;  // never destroyed
//   Plan& p = plans->find_or_make(key, [&] { return make_plan(...); });
//
// Plans are found under a lock and, once kept, never move or die (a static plan's step keeps a
// pointer in its KernelArgs::state, and work may still be queued at exit).
#pragma once

#include <memory>
#include <mutex>

#include "absl/container/flat_hash_map.h"

namespace encore::kernels::cuda {

template <typename Key, typename Plan>
class PlanCache {
 public:
  // The plan of `key`; make() (returning std::unique_ptr<Plan>) makes it on first use, outside
  // the lock: making one may wait (a cuDNN handle, a workspace that waits for another thread's
  // graph capture to end), and that capture may look a plan up meanwhile. Two threads that make
  // one plan at once each make it; the first kept is the one both use. An exception from make()
  // leaves no plan.
  template <typename Make>
  Plan& find_or_make(const Key& key, Make&& make) {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      if (const auto it = plans_.find(key); it != plans_.end()) return *it->second;
    }
    std::unique_ptr<Plan> made = make();
    const std::lock_guard<std::mutex> lock(mu_);
    return *plans_.try_emplace(key, std::move(made)).first->second;
  }

 private:
  std::mutex mu_;
  absl::flat_hash_map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace encore::kernels::cuda
