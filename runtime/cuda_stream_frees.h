// Frees that wait for streams (Tensor::record_stream): a storage used by work on streams other
// than the one its device's allocator orders reuse by goes back to the allocator only once those
// streams have passed the point where it was freed. Internal to the runtime (storage.cc,
// cuda.cc).
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "runtime/allocator.h"

namespace encore::cuda {

// Records an event on each of `streams` (cudaStream_t) of `device` and hands (p, bytes) back to
// `allocator` once all have completed; where an event cannot be had, waits for the streams and
// frees at once. Where one of them is being captured into a CUDA graph, all of this waits until
// no capture is in progress (cuda::after_captures). Never throws (a storage's destructor calls
// it).
void free_after_streams(int device, std::span<void* const> streams, Allocator& allocator, void* p,
                        size_t bytes) noexcept;

// `inner` (a device's caching allocator) that first returns the frees whose streams have passed
// them, and waits for all of them before emptying its cache.
std::unique_ptr<Allocator> stream_ordered(std::unique_ptr<Allocator> inner);

}  // namespace encore::cuda
