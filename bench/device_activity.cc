// CUPTI's activity API (device_activity.h): buffers handed to CUPTI on request, their kernel,
// memcpy and memset records summed as CUPTI completes them, the kernels also by name, and each
// record's span kept (up to kMaxSpans) for the graph launches' timelines.
#include "bench/device_activity.h"

#include <cstdio>

#if defined(ENCORE_HAS_CUDA) && defined(ENCORE_BENCH_CUPTI)
#include <cuda_runtime_api.h>
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>
#endif

namespace encore::bench {

std::string kernel_table(const DeviceActivity& activity, int64_t iterations) {
  if (iterations <= 0 || activity.by_kernel.empty()) return "";
  const auto iters = static_cast<double>(iterations);
  std::string out = " calls/step    us/step  share  kernel\n";
  char line[96];
  for (const KernelTotal& k : activity.by_kernel) {
    const double share = activity.kernel_ns > 0
                             ? static_cast<double>(k.ns) / static_cast<double>(activity.kernel_ns)
                             : 0;
    std::snprintf(line, sizeof line, "%11.2f %10.2f %5.1f%%  ",
                  static_cast<double>(k.calls) / iters, static_cast<double>(k.ns) * 1e-3 / iters,
                  100 * share);
    out += line;
    out += k.name;
    out += '\n';
  }
  return out;
}

#if defined(ENCORE_HAS_CUDA) && defined(ENCORE_BENCH_CUPTI)
namespace {

constexpr size_t kBufferBytes = size_t{8} << 20;
constexpr size_t kAlign = 8;  // CUPTI's activity buffers must be 8-byte aligned

std::mutex g_mu;  // CUPTI completes buffers on its own thread
DeviceActivity g_sum;                          // its names mangled until stop_device_activity()
std::map<std::string, KernelTotal> g_by_name;  // under g_mu
std::map<std::string, int> g_name_index;       // under g_mu: into g_sum.names

// A kernel's name as a reader wants it: demangled, without "void " and its parameter list.
std::string kernel_name(const char* mangled) {
  if (mangled == nullptr) return "?";
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled != nullptr ? demangled : mangled;
  std::free(demangled);
  if (name.rfind("void ", 0) == 0) name.erase(0, 5);
  if (!name.empty() && name.back() == ')') {  // cut the parameter list, at its opening bracket
    int depth = 0;
    for (size_t i = name.size(); i-- > 0;) {
      if (name[i] == ')') ++depth;
      if (name[i] == '(' && --depth == 0) {
        name.resize(i);
        break;
      }
    }
  }
  constexpr size_t kMaxName = 140;
  if (name.size() > kMaxName) name = name.substr(0, kMaxName - 3) + "...";
  return name;
}

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
  std::map<std::string, KernelTotal> by_name;
  std::vector<const char*> span_names;  // per span of `part`, its kernel's mangled name or null
  // A kernel, memcpy or memset record r: one without both timestamps (a forced flush cut short)
  // is counted as dropped; the others are added to `ns` and `count` and kept as spans (`name`: a
  // kernel's). Returns whether it was added.
  auto add = [&](const auto* r, int64_t& ns, int64_t& count, const char* name) {
    if (r->start == 0 || r->end < r->start) {
      ++part.dropped;
      return false;
    }
    ns += static_cast<int64_t>(r->end - r->start);
    ++count;
    part.spans.push_back({r->start, r->end, r->streamId, r->graphId, r->graphNodeId, -1});
    span_names.push_back(name);
    return true;
  };
  CUpti_Activity* record = nullptr;
  CUptiResult next = CUPTI_SUCCESS;
  while ((next = cuptiActivityGetNextRecord(buffer, valid, &record)) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        const char* name = k->name != nullptr ? k->name : "?";
        if (add(k, part.kernel_ns, part.kernels, name)) {
          KernelTotal& total = by_name[name];
          ++total.calls;
          total.ns += static_cast<int64_t>(k->end - k->start);
        }
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY:
        add(reinterpret_cast<const CUpti_ActivityMemcpy6*>(record), part.copy_ns, part.copies,
            nullptr);
        break;
      case CUPTI_ACTIVITY_KIND_MEMSET:
        add(reinterpret_cast<const CUpti_ActivityMemset4*>(record), part.copy_ns, part.copies,
            nullptr);
        break;
      default:
        break;
    }
  }
  // The end of the buffer, or a record CUPTI could not read (the rest are lost).
  if (next != CUPTI_ERROR_MAX_LIMIT_REACHED) ++part.dropped;
  size_t dropped = 0;  // since the last call, which resets the count
  if (cuptiActivityGetNumDroppedRecords(context, stream, &dropped) == CUPTI_SUCCESS)
    part.dropped += static_cast<int64_t>(dropped);
  std::lock_guard<std::mutex> lock(g_mu);
  g_sum.kernel_ns += part.kernel_ns;
  g_sum.kernels += part.kernels;
  g_sum.copy_ns += part.copy_ns;
  g_sum.copies += part.copies;
  g_sum.dropped += part.dropped;
  for (auto& [name, total] : by_name) {
    KernelTotal& into = g_by_name[name];
    into.calls += total.calls;
    into.ns += total.ns;
  }
  for (size_t i = 0; i < part.spans.size(); ++i) {
    if (g_sum.spans.size() == kMaxSpans) {
      g_sum.spans_left_out += static_cast<int64_t>(part.spans.size() - i);
      break;
    }
    DeviceSpan& span = g_sum.spans.emplace_back(part.spans[i]);
    if (span_names[i] != nullptr) {
      const auto [at, added] =
          g_name_index.try_emplace(span_names[i], static_cast<int>(g_sum.names.size()));
      if (added) g_sum.names.emplace_back(span_names[i]);
      span.name = at->second;
    }
  }
  std::free(buffer);  // after the last use of a name pointer its records held
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
    g_by_name.clear();
    g_name_index.clear();
    g_sum.spans.reserve(kMaxSpans);
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
  DeviceActivity result = std::move(g_sum);
  g_sum = {};
  g_name_index.clear();
  for (std::string& name : result.names) name = kernel_name(name.c_str());
  // Kernels whose demangled names agree (instances differing only in their parameter lists) are
  // one row.
  std::map<std::string, KernelTotal> by_short_name;
  for (const auto& [mangled, total] : g_by_name) {
    KernelTotal& row = by_short_name[kernel_name(mangled.c_str())];
    row.calls += total.calls;
    row.ns += total.ns;
  }
  for (auto& [name, total] : by_short_name) {
    total.name = name;
    result.by_kernel.push_back(std::move(total));
  }
  std::sort(result.by_kernel.begin(), result.by_kernel.end(),
            [](const KernelTotal& a, const KernelTotal& b) { return a.ns > b.ns; });
  return result;
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
