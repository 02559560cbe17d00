// Device allocators with statistics. The CPU allocator caches freed blocks by size class so a
// training loop reaches a steady state with no calls into the system allocator.
//
//   auto before = encore::allocator_for(Device::cpu()).stats().bytes_in_use;
//   ... // train
//   assert(encore::allocator_for(Device::cpu()).stats().bytes_in_use == before);
#pragma once

#include <cstddef>
#include <cstdint>

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

// The allocator of a device. Throws Error for a device type without a backend.
Allocator& allocator_for(Device d);
// Installs the allocator of a device type (a backend does this once at start-up).
void register_allocator(DeviceType t, Allocator* a);

}  // namespace encore
