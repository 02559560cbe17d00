// CUPTI's activity API (device_activity.h): buffers handed to CUPTI on request, their kernel,
// memcpy and memset records summed as CUPTI completes them.
#include "bench/device_activity.h"

#if defined(ENCORE_HAS_CUDA) && defined(ENCORE_BENCH_CUPTI)
#include <cuda_runtime_api.h>
#include <cupti.h>

#include <cstdlib>
#include <mutex>
#endif

namespace encore::bench {

#if defined(ENCORE_HAS_CUDA) && defined(ENCORE_BENCH_CUPTI)
namespace {

constexpr size_t kBufferBytes = size_t{8} << 20;
constexpr size_t kAlign = 8;  // CUPTI's activity buffers must be 8-byte aligned

std::mutex g_mu;  // CUPTI completes buffers on its own thread
DeviceActivity g_sum;

const CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                     CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kAlign, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer, size_t,
                               size_t valid) {
  DeviceActivity part;
  // A record without both timestamps (one a forced flush cut short) is counted as dropped.
  auto add = [&part](uint64_t start, uint64_t end, int64_t& ns, int64_t& count) {
    if (start == 0 || end < start) {
      ++part.dropped;
      return;
    }
    ns += static_cast<int64_t>(end - start);
    ++count;
  };
  CUpti_Activity* record = nullptr;
  CUptiResult next = CUPTI_SUCCESS;
  while ((next = cuptiActivityGetNextRecord(buffer, valid, &record)) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        add(k->start, k->end, part.kernel_ns, part.kernels);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* c = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        add(c->start, c->end, part.copy_ns, part.copies);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        add(m->start, m->end, part.copy_ns, part.copies);
        break;
      }
      default:
        break;
    }
  }
  // The end of the buffer, or a record CUPTI could not read (the rest are lost).
  if (next != CUPTI_ERROR_MAX_LIMIT_REACHED) ++part.dropped;
  size_t dropped = 0;  // since the last call, which resets the count
  if (cuptiActivityGetNumDroppedRecords(context, stream, &dropped) == CUPTI_SUCCESS)
    part.dropped += static_cast<int64_t>(dropped);
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mu);
  g_sum.kernel_ns += part.kernel_ns;
  g_sum.kernels += part.kernels;
  g_sum.copy_ns += part.copy_ns;
  g_sum.copies += part.copies;
  g_sum.dropped += part.dropped;
}

std::string failed(const char* call, CUptiResult r) {
  const char* text = nullptr;
  if (cuptiGetResultString(r, &text) != CUPTI_SUCCESS || text == nullptr) text = "unknown error";
  return std::string(call) + ": " + text;
}

bool g_recording = false;

}  // namespace

std::string start_device_activity() {
  static const CUptiResult registered =
      cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  if (registered != CUPTI_SUCCESS) return failed("cuptiActivityRegisterCallbacks", registered);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_sum = {};
  }
  for (const CUpti_ActivityKind kind : kKinds) {
    if (const CUptiResult r = cuptiActivityEnable(kind); r != CUPTI_SUCCESS) {
      for (const CUpti_ActivityKind k : kKinds) cuptiActivityDisable(k);
      return failed("cuptiActivityEnable", r);
    }
  }
  g_recording = true;
  return "";
}

DeviceActivity stop_device_activity() {
  if (!g_recording) return {};
  g_recording = false;
  cudaDeviceSynchronize();
  for (const CUpti_ActivityKind kind : kKinds) cuptiActivityDisable(kind);
  cuptiActivityFlushAll(0);  // the completed records, then any left
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(g_mu);
  return g_sum;
}

#else

std::string start_device_activity() {
  return "this build has no CUPTI";
}
DeviceActivity stop_device_activity() {
  return {};
}

#endif

}  // namespace encore::bench
