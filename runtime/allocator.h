// Device allocators with statistics. Each caches freed blocks by size class so a training loop
// reaches a steady state with no calls into the system allocator (or cudaMalloc).
//
//   auto before = encore::allocator_for(Device::cpu()).stats().bytes_in_use;
//   ... // train
//   assert(encore::allocator_for(Device::cpu()).stats().bytes_in_use == before);
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/device.h"

namespace encore {

struct AllocatorStats {
  int64_t bytes_in_use = 0;        // bytes of live blocks (rounded to the size class)
  int64_t peak_bytes = 0;          // highest bytes_in_use since start or reset_peak()
  int64_t allocation_count = 0;    // allocate() calls since start
  int64_t live_blocks = 0;         // blocks handed out and not yet returned
  int64_t bytes_cached = 0;        // freed bytes kept for reuse
  int64_t system_allocations = 0;  // allocate() calls that reached the system allocator
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns a block of at least `bytes` bytes, 64-byte aligned. `bytes` may be zero.
  virtual void* allocate(size_t bytes) = 0;
  // Returns a block; `bytes` is the size passed to allocate().
  virtual void deallocate(void* p, size_t bytes) = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak() = 0;
  // Releases cached blocks to the system.
  virtual void empty_cache() = 0;
};

// The allocator of a device. Throws Error for a device without a backend.
Allocator& allocator_for(Device d);
// Installs how a backend makes the allocator of each device of type `t` (once, at start-up);
// allocator_for() calls `make` on a device's first use and keeps the result for the process.
void register_allocator_factory(DeviceType t, Allocator* (*make)(int index));

// A caching allocator over raw memory: freed blocks are kept by size class (64-byte multiples up
// to 4 KiB, then four classes per power of two) so a training loop reaches a steady state with no
// calls to `raw_alloc`. `raw_alloc` returns null when out of memory (the cache is then released
// and the call retried once); `device` names the memory in errors.
struct RawMemory {
  void* (*raw_alloc)(void* ctx, size_t bytes) = nullptr;
  void (*raw_free)(void* ctx, void* p) = nullptr;
  void* ctx = nullptr;
  std::string device;
};
std::unique_ptr<Allocator> make_caching_allocator(RawMemory raw);

// allocate() calls of caching allocators this thread made since it started, cached blocks
// included: a CUDA-graph capture that sees this change has baked a block into the graph.
int64_t thread_allocation_count();

}  // namespace encore
