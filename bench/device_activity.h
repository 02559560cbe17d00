// The device time of the kernels, copies and fills a stretch of work ran, from CUPTI's activity
// records (CUDA builds with CUPTI): each kernel's own start and end on the device, with nothing
// inserted between kernels (the profiler's events are), for the kernel nodes of CUDA graph
// launches too. KernelSum/<case>/cuda sets a replayed step's wall time beside this sum, and the
// graph launches' timelines (bench/device_timeline.h) beside it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/device_timeline.h"

namespace encore::bench {

// One kernel's runs: its demangled name, how many times it ran and their summed duration.
struct KernelTotal {
  std::string name;
  int64_t calls = 0, ns = 0;
};

struct DeviceActivity {
  int64_t kernel_ns = 0, kernels = 0;  // summed durations, and how many
  int64_t copy_ns = 0, copies = 0;     // memcpy and memset
  int64_t dropped = 0;  // records CUPTI could not keep or complete (the sums miss them)
  std::vector<KernelTotal> by_kernel;  // the kernels by name, largest total first
  // Each kernel, copy and fill, up to kMaxSpans of them in the order CUPTI completed them (a
  // kernel's `name` indexes `names`), and how many more were left out.
  std::vector<DeviceSpan> spans;
  std::vector<std::string> names;
  int64_t spans_left_out = 0;
};

inline constexpr size_t kMaxSpans = size_t{1} << 17;

// The kernels of `activity` as a table, `iterations` steps' worth: per step calls and
// microseconds, share of the kernel time, name.
std::string kernel_table(const DeviceActivity& activity, int64_t iterations);

// Records device activity from start_device_activity() to stop_device_activity() (one stretch at
// a time, on the calling thread's process). start returns "" or why it cannot record (no CUPTI
// in this build, or a CUPTI error), and stop then returns zeros. stop waits for the device.
std::string start_device_activity();
DeviceActivity stop_device_activity();

}  // namespace encore::bench
