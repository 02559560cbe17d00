#include "runtime/storage.h"

#include <algorithm>
#include <atomic>
#include <mutex>

#include "runtime/cuda_stream_frees.h"

namespace encore {
namespace {
std::atomic<uint64_t> g_next_serial{1};

// Every StorageWatch alive, and how many (read without the lock by each freed storage).
std::mutex g_watch_mu;
std::vector<StorageWatch*> g_watches;
std::atomic<int> g_watch_count{0};
}  // namespace

StorageWatch::StorageWatch() {
  std::lock_guard lock(g_watch_mu);
  g_watches.push_back(this);
  g_watch_count.fetch_add(1, std::memory_order_release);
}

StorageWatch::~StorageWatch() {
  std::lock_guard lock(g_watch_mu);
  g_watches.erase(std::find(g_watches.begin(), g_watches.end(), this));
  g_watch_count.fetch_sub(1, std::memory_order_release);
}

void StorageWatch::add(const Storage& s) {
  std::lock_guard lock(g_watch_mu);
  live_.insert(s.serial());
}

std::vector<uint64_t> StorageWatch::alive() const {
  std::lock_guard lock(g_watch_mu);
  return {live_.begin(), live_.end()};
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
  if (g_watch_count.load(std::memory_order_acquire) != 0) {
    std::lock_guard lock(g_watch_mu);
    for (StorageWatch* w : g_watches) w->live_.erase(serial_);
  }
  if (!streams_.empty()) {
    cuda::free_after_streams(device_.index, streams_, *allocator_, data_, nbytes_);
    return;
  }
  allocator_->deallocate(data_, nbytes_);
}

}  // namespace encore
