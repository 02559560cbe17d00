#include "runtime/allocator.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <new>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "runtime/error.h"

namespace encore {
namespace {

// Size classes: multiples of 64 bytes up to 4 KiB, then four classes per power of two, so a
// cached block is never more than 25% larger than the request.
size_t size_class(size_t bytes) {
  if (bytes <= 4096) return bytes == 0 ? 64 : (bytes + 63) & ~size_t{63};
  ENCORE_CHECK(bytes <= (size_t{1} << 62), "allocate: ", bytes,
               " bytes is more than any device has");
  const int lg = 63 - __builtin_clzll(bytes - 1);  // 2^lg < bytes <= 2^(lg+1)
  const size_t quarter = size_t{1} << (lg - 2);
  return (bytes + quarter - 1) / quarter * quarter;
}

thread_local int64_t t_allocations = 0;

class CachingAllocator final : public Allocator {
 public:
  explicit CachingAllocator(RawMemory raw) : raw_(std::move(raw)) {}
  ~CachingAllocator() override { empty_cache(); }

  void* allocate(size_t bytes) override {
    ++t_allocations;
    const size_t cls = size_class(bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.allocation_count;
      ++stats_.live_blocks;
      stats_.bytes_in_use += cls;
      auto it = free_.find(cls);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        stats_.bytes_cached -= cls;
        note_peak();
        return p;
      }
      ++stats_.system_allocations;
    }
    // Outside the lock: a device's raw calls may wait for work that itself returns blocks here
    // (a stream callback releasing a pinned buffer).
    void* p = nullptr;
    try {
      p = raw_.raw_alloc(raw_.ctx, cls);
      if (p == nullptr) {
        empty_cache();
        p = raw_.raw_alloc(raw_.ctx, cls);
      }
    } catch (...) {
      undo_allocation(cls);
      throw;
    }
    if (p == nullptr) {
      undo_allocation(cls);
      const AllocatorStats st = stats();
      fail("allocate: out of memory allocating ", bytes, " bytes on ", raw_.device, " (",
           st.bytes_in_use, " bytes in use, peak ", st.peak_bytes, ")");
    }
    std::lock_guard<std::mutex> lock(mu_);
    note_peak();  // only now: a request that fails never counts towards the peak
    return p;
  }

  void deallocate(void* p, size_t bytes) override {
    if (p == nullptr) return;
    const size_t cls = size_class(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_in_use -= cls;
    --stats_.live_blocks;
    stats_.bytes_cached += cls;
    free_[cls].push_back(p);
  }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_bytes = stats_.bytes_in_use;
  }
  void empty_cache() override {
    absl::flat_hash_map<size_t, std::vector<void*>> blocks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      blocks.swap(free_);
      stats_.bytes_cached = 0;
    }
    for (auto& [cls, list] : blocks)
      for (void* p : list) raw_.raw_free(raw_.ctx, p);
  }

 private:
  // With mu_ held, after a block was handed out.
  void note_peak() { stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.bytes_in_use); }
  void undo_allocation(size_t cls) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_in_use -= cls;
    --stats_.live_blocks;
  }

  RawMemory raw_;
  mutable std::mutex mu_;
  AllocatorStats stats_;
  absl::flat_hash_map<size_t, std::vector<void*>> free_;
};

constexpr int kMaxDeviceIndex = 64;

struct Registry {
  std::mutex mu;
  Allocator* (*factory[kNumDeviceTypes])(int) = {};
  std::atomic<Allocator*> made[kNumDeviceTypes][kMaxDeviceIndex] = {};
};
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

}  // namespace

int64_t thread_allocation_count() {
  return t_allocations;
}

std::unique_ptr<Allocator> make_caching_allocator(RawMemory raw) {
  return std::make_unique<CachingAllocator>(std::move(raw));
}

Allocator& allocator_for(Device d) {
  if (d.type == DeviceType::CPU) {
    // Never destroyed: tensors in static objects may outlive any destruction order.
    static Allocator* cpu =
        make_caching_allocator({[](void*, size_t n) { return std::aligned_alloc(64, n); },
                                [](void*, void* p) { std::free(p); }, nullptr, "cpu"})
            .release();
    return *cpu;
  }
  ENCORE_CHECK(d.index >= 0 && d.index < kMaxDeviceIndex, "allocator: bad device index ", d);
  Registry& r = registry();
  const int t = static_cast<int>(d.type);
  std::atomic<Allocator*>& slot = r.made[t][d.index];
  if (Allocator* a = slot.load(std::memory_order_acquire)) [[likely]]
    return *a;
  std::lock_guard<std::mutex> lock(r.mu);
  if (slot.load(std::memory_order_relaxed) == nullptr) {
    ENCORE_CHECK(r.factory[t] != nullptr, "allocator: no backend for device ", d,
                 " (this build has no CUDA support)");
    slot.store(r.factory[t](d.index), std::memory_order_release);
  }
  return *slot.load(std::memory_order_relaxed);
}

void register_allocator_factory(DeviceType t, Allocator* (*make)(int index)) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factory[static_cast<int>(t)] = make;
}

}  // namespace encore
