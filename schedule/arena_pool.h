// Arenas shared by the planned sizes of a dynamic family on the cpu: a call takes a block big
// enough for its size's arena and gives it back when it releases its call state, so a loop over
// many sizes works in the same (cache-warm) memory, and the family holds one block per call
// under way instead of one arena per size. Internal to schedule/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "runtime/device.h"

namespace encore::schedule {

class ArenaPool {
 public:
  explicit ArenaPool(Device device) : device_(device) {}
  ~ArenaPool();
  ArenaPool(const ArenaPool&) = delete;
  ArenaPool& operator=(const ArenaPool&) = delete;

  // A block of at least `bytes`: the free block returned last that is big enough, else a new
  // one (a free block too small for it is freed first). Thread-safe.
  void* take(size_t bytes);
  void give(void* block);
  // Bytes of the blocks held, free or taken.
  int64_t bytes() const;

 private:
  struct Block {
    void* data;
    size_t bytes;
    bool taken;
  };
  Device device_;
  mutable std::mutex mu_;
  std::vector<Block> blocks_;  // in the order they were last given back (the last one warmest)
};

}  // namespace encore::schedule
