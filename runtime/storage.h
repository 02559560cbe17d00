// Storage: a reference-counted buffer on one device, shared by a tensor and its views.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/intrusive_ptr.h"

namespace encore {

class Storage final : public RefCounted {
 public:
  // Allocates `nbytes` from the device's allocator, or from `allocator` (memory on `device`, e.g.
  // pinned host memory for a cpu tensor).
  Storage(size_t nbytes, Device device, Allocator* allocator = nullptr);
  ~Storage() override;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  Allocator& allocator() const { return *allocator_; }

  // Incremented by every in-place write; autograd compares it with the value saved at
  // record time to detect a saved tensor modified before backward.
  uint32_t version() const { return version_; }
  void bump_version() { ++version_; }

  // Marks that work queued on `stream` (a cudaStream_t of this storage's device) uses it: when
  // the storage is freed, its block goes back to the allocator only once the stream has passed
  // that point (Tensor::record_stream).
  void record_stream(void* stream);

  // A number no other storage of this process has or will have (creation order).
  uint64_t serial() const { return serial_; }
  // The serial the next storage will get.
  static uint64_t next_serial();

 private:
  Allocator* allocator_;
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  uint32_t version_ = 0;
  uint64_t serial_;
  std::vector<void*> streams_;  // recorded by record_stream
};

// The serials of storages someone watches (a static trace: which temporaries it made outlive
// its call). A watched serial leaves the set when its storage is freed, on whatever thread; a
// storage freed while no watch exists pays one atomic load.
class StorageWatch {
 public:
  StorageWatch();
  ~StorageWatch();
  StorageWatch(const StorageWatch&) = delete;
  StorageWatch& operator=(const StorageWatch&) = delete;

  void add(const Storage& s);           // a live storage
  std::vector<uint64_t> alive() const;  // the watched serials not yet freed, in any order

 private:
  friend class Storage;
  absl::flat_hash_set<uint64_t> live_;  // guarded by the watches' mutex
};

}  // namespace encore
