#include "runtime/storage.h"

#include <atomic>

#include "runtime/cuda_stream_frees.h"

namespace encore {
namespace {
std::atomic<uint64_t> g_next_serial{1};
}

Storage::Storage(size_t nbytes, Device device, Allocator* allocator)
    : allocator_(allocator != nullptr ? allocator : &allocator_for(device)),
      data_(allocator_->allocate(nbytes)),
      nbytes_(nbytes),
      device_(device),
      serial_(g_next_serial.fetch_add(1, std::memory_order_relaxed)) {}

uint64_t Storage::next_serial() {
  return g_next_serial.load(std::memory_order_relaxed);
}

void Storage::record_stream(void* stream) {
  for (void* s : streams_)
    if (s == stream) return;
  streams_.push_back(stream);
}

Storage::~Storage() {
  if (!streams_.empty()) {
    cuda::free_after_streams(device_.index, streams_, *allocator_, data_, nbytes_);
    return;
  }
  allocator_->deallocate(data_, nbytes_);
}

}  // namespace encore
