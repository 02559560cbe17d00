// ArenaPool: blocks shared by the planned sizes of a dynamic family.
#include "schedule/arena_pool.h"

#include <algorithm>

#include "runtime/allocator.h"
#include "runtime/error.h"

namespace encore::schedule {

ArenaPool::~ArenaPool() {
  for (const Block& b : blocks_) allocator_for(device_).deallocate(b.data, b.bytes);
}

void* ArenaPool::take(size_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  for (size_t i = blocks_.size(); i-- > 0;)
    if (!blocks_[i].taken && blocks_[i].bytes >= bytes) {
      blocks_[i].taken = true;
      return blocks_[i].data;
    }
  // None fits: a free block too small goes (its memory returns to the allocator's cache).
  for (size_t i = blocks_.size(); i-- > 0;)
    if (!blocks_[i].taken) {
      allocator_for(device_).deallocate(blocks_[i].data, blocks_[i].bytes);
      blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  void* data = allocator_for(device_).allocate(bytes);
  blocks_.push_back({data, bytes, true});
  return data;
}

void ArenaPool::give(void* block) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = std::find_if(blocks_.begin(), blocks_.end(),
                         [block](const Block& b) { return b.data == block; });
  ENCORE_CHECK(it != blocks_.end() && it->taken, "ArenaPool: a block given back twice");
  Block b = *it;
  b.taken = false;
  blocks_.erase(it);
  blocks_.push_back(b);  // the warmest last
}

int64_t ArenaPool::bytes() const {
  std::lock_guard<std::mutex> l(mu_);
  int64_t n = 0;
  for (const Block& b : blocks_) n += static_cast<int64_t>(b.bytes);
  return n;
}

}  // namespace encore::schedule
