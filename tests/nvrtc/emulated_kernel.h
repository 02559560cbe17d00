// Runs CUDA kernels on the host: a fused program's generated kernel (fused_source.h) with
// element_ops.cuh, or a kernel header of our own (HostObject: small_gemm.cuh, embedding.cuh, ...),
// compiled by the host's C++ compiler against a header that stands in for the CUDA built-ins
// (threadIdx, blockIdx, gridDim, blockDim, shared memory, __syncthreads, the warp shuffles and
// ballots, the atomics and fences the kernels use, the bit casts, the asynchronous copies to
// shared memory, which land only when their thread waits for them, dynamic shared memory), and
// launched on one host thread as a grid of blocks, one after another, each CUDA thread a fiber
// that runs until it waits at a barrier (a warp's at each shuffle, ballot or __syncwarp, a
// block's at each __syncthreads); the schedule and the poisoned shared memory (emulate_launch,
// __shared__) make a missing barrier show. It checks what a kernel computes where (indices,
// layouts, folds, the warp tree, which lane writes, what a barrier orders), not the device's
// rounding: the host's libm stands in for CUDA's.
#pragma once

#include <dlfcn.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cuda/fused_source.h"
#include "runtime/cuda.h"
#include "runtime/error.h"
#include "runtime/fused.h"

namespace encore::testing {

// The CUDA built-ins that the generated kernels, element_ops.cuh and our kernel headers use, for
// the host.
inline constexpr const char* kCudaOnHost = R"cuda(
#pragma once
#include <ucontext.h>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <source_location>
#include <vector>
#include <vector_types.h>  // dim3
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
// Blocks run one after another (emulate_launch), so one static array per kernel is each block's
// own shared memory while that block runs. They are all in one section, which emulate_launch
// fills with 0xff bytes (NaN, -1) before each block: a read of shared memory the block never wrote
// shows, rather than the last block's values.
#define __shared__ static __attribute__((section("encore_shared")))
extern "C" char __start_encore_shared[] __attribute__((weak));
extern "C" char __stop_encore_shared[] __attribute__((weak));
// Dynamic shared memory (kernels/cuda/dynamic_shared.cuh): as much as any GPU gives a block,
// poisoned as the static arrays are, when a block first asks for it; a block that writes past
// what its launch gave it (emulate_launch's dynamic_bytes; none where a launch does not say)
// aborts the process, unless what it wrote there is 0xff bytes, the poison.
#define ENCORE_EMULATED_DYNAMIC_SHARED 1
alignas(16) static unsigned char emulated_dynamic_bytes[227 * 1024];
static bool emulated_dynamic_poisoned = false;  // in the running block
inline unsigned char* emulated_dynamic_shared() {
  if (!emulated_dynamic_poisoned) {
    std::memset(emulated_dynamic_bytes, 0xff, sizeof emulated_dynamic_bytes);
    emulated_dynamic_poisoned = true;
  }
  return emulated_dynamic_bytes;
}
struct EmulatedDim3 { unsigned x = 0, y = 0, z = 0; };
// Internal linkage: each kernel's shared object has its own. One host thread runs a launch: the
// CUDA threads of a block are fibers on it, and these are the running fiber's.
static EmulatedDim3 threadIdx, blockIdx, gridDim, blockDim;
static unsigned emulated_lane = 0;
static ucontext_t emulated_scheduler;
static ucontext_t* emulated_running = nullptr;
static unsigned long long emulated_progress = 0;  // arrivals at barriers and finished threads
// The threads of a warp meet here at each shuffle or ballot, those of a block at each
// __syncthreads: a thread that arrives before the others yields until the last one arrives.
// All of them must meet at the same place in the source (a shuffle or __syncthreads in code that
// only some threads of the warp or block run is undefined on a GPU): the process aborts if not.
struct EmulatedBarrier {
  unsigned count = 0, arrived = 0, round = 0;
  std::source_location site;  // where the round's first thread arrived
  void meet(const std::source_location& at) {
    const unsigned r = round;
    ++emulated_progress;
    if (arrived == 0) {
      site = at;
    } else if (at.line() != site.line() || at.column() != site.column() ||
               std::strcmp(at.file_name(), site.file_name()) != 0) {
      std::fprintf(stderr, "emulated kernel: threads meet at %s:%u:%u and at %s:%u:%u\n",
                   site.file_name(), site.line(), site.column(), at.file_name(), at.line(),
                   at.column());
      std::abort();
    }
    if (++arrived == count) {
      arrived = 0;
      ++round;
      return;
    }
    while (round == r) swapcontext(emulated_running, &emulated_scheduler);
  }
};
struct EmulatedWarp : EmulatedBarrier {
  alignas(8) unsigned char slot[32][8];
};
static EmulatedWarp* emulated_warp = nullptr;
static EmulatedBarrier* emulated_block = nullptr;
inline void __syncthreads(std::source_location at = std::source_location::current()) {
  emulated_block->meet(at);
}
inline void __syncwarp(unsigned = 0xffffffffu,
                       std::source_location at = std::source_location::current()) {
  emulated_warp->meet(at);
}
inline void __threadfence_system() {}
inline void __threadfence() {}
// Every lane's v, gathered: v of lane l lands in all[l].
template <typename T>
void emulated_gather(T v, T (&all)[32], const std::source_location& at) {
  static_assert(sizeof(T) <= sizeof(EmulatedWarp::slot[0]));
  std::memcpy(emulated_warp->slot[emulated_lane], &v, sizeof(T));
  EmulatedWarp* warp = emulated_warp;
  warp->meet(at);
  for (unsigned l = 0; l < warp->count; ++l) std::memcpy(&all[l], warp->slot[l], sizeof(T));
  warp->meet(at);
}
template <typename T>
T emulated_exchange(T v, unsigned from, const std::source_location& at) {
  T all[32];
  emulated_gather(v, all, at);
  return all[from % 32];
}
template <typename T>
T __shfl_xor_sync(unsigned, T v, int o,
                  std::source_location at = std::source_location::current()) {
  return emulated_exchange(v, emulated_lane ^ o, at);
}
template <typename T>
T __shfl_sync(unsigned, T v, int src, std::source_location at = std::source_location::current()) {
  return emulated_exchange(v, src, at);
}
inline unsigned __ballot_sync(unsigned, int predicate,
                              std::source_location at = std::source_location::current()) {
  int all[32];
  emulated_gather(predicate, all, at);
  unsigned bits = 0;
  for (unsigned l = 0; l < 32; ++l) bits |= (l < emulated_warp->count && all[l] != 0 ? 1u : 0u) << l;
  return bits;
}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = old + v;
  return old;
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  const unsigned long long old = *p;
  *p = old + v;
  return old;
}
inline unsigned long long atomicExch(unsigned long long* p, unsigned long long v) {
  const unsigned long long old = *p;
  *p = v;
  return old;
}
inline unsigned atomicCAS(unsigned* p, unsigned expected, unsigned desired) {
  const unsigned old = *p;
  if (old == expected) *p = desired;
  return old;
}
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
// Asynchronous copies (kernels/cuda/async_copy.cuh): a copy poisons its destination when it is
// issued and lands when its thread waits for it (wait_async_copies), so shared memory read after
// a barrier that no wait preceded is poisoned, in a chunk after the first too. A copy not aligned
// to its size, or a thread that ends with copies it never waited for, aborts the process.
#define ENCORE_EMULATED_ASYNC_COPIES 1
struct EmulatedCopy {
  void* dst;
  const void* src;
  int bytes;
};
static std::vector<EmulatedCopy>* emulated_copies = nullptr;  // the running thread's, pending
inline void emulated_copy_async(void* dst, const void* src, int bytes) {
  if (reinterpret_cast<uintptr_t>(dst) % bytes != 0 || reinterpret_cast<uintptr_t>(src) % bytes != 0) {
    std::fprintf(stderr, "emulated kernel: an asynchronous copy of %d bytes from %p to %p is not "
                 "aligned to its size\n", bytes, src, dst);
    std::abort();
  }
  std::memset(dst, 0xff, bytes);
  emulated_copies->push_back({dst, src, bytes});
}
inline void emulated_wait_async_copies() {
  for (const EmulatedCopy& c : *emulated_copies) std::memcpy(c.dst, c.src, c.bytes);
  emulated_copies->clear();
}
static const std::function<void()>* emulated_kernel = nullptr;
static unsigned char* emulated_finished = nullptr;
static void emulated_thread() {
  (*emulated_kernel)();
  *emulated_finished = 1;
  ++emulated_progress;
}  // then uc_link: back to the scheduler
// Runs kernel() on a grid of blocks of threads, one block after another, the last first (x
// fastest, downwards: a kernel that takes the last block to finish for the last block of the grid
// shows, as does one that needs blocks to run in order, which a GPU does not promise). A block's
// threads are fibers, resumed in turn, each running until it waits at a barrier or ends; a
// warp is 32 consecutive threads (x fastest). Each warp in turn runs as far as it can (its lanes
// meeting at its shuffles) before the next one starts, the warps and their lanes taken up and
// down by turns, starting one way or the other by the block: a value one thread writes and another
// reads with no barrier between them (a missing __syncthreads) is read before it is written, or
// after it is written again, in some block. A turn in which no thread arrives at a barrier or ends is a deadlock (a
// shuffle in divergent code, a __syncthreads some threads skip): the process aborts, saying so.
inline void emulate_launch(EmulatedDim3 grid, EmulatedDim3 block, size_t dynamic_bytes,
                           std::function<void()> kernel) {
  constexpr size_t kStack = 64 * 1024;
  gridDim = grid;
  blockDim = block;
  emulated_kernel = &kernel;
  const unsigned threads = block.x * block.y * block.z;
  const std::unique_ptr<char[]> stacks(new char[threads * kStack]);  // untouched until used
  std::vector<ucontext_t> contexts(threads);
  std::vector<unsigned char> finished(threads);
  std::vector<std::vector<EmulatedCopy>> copies(threads);
  for (unsigned bz = grid.z; bz-- > 0;)
    for (unsigned by = grid.y; by-- > 0;)
      for (unsigned bx = grid.x; bx-- > 0;) {
        blockIdx = {bx, by, bz};
        EmulatedBarrier barrier;
        barrier.count = threads;
        std::vector<EmulatedWarp> warps((threads + 31) / 32);
        for (unsigned w = 0; w < warps.size(); ++w)
          warps[w].count = threads - 32 * w < 32 ? threads - 32 * w : 32;
        if (__start_encore_shared != nullptr)
          std::memset(__start_encore_shared, 0xff, __stop_encore_shared - __start_encore_shared);
        emulated_dynamic_poisoned = false;
        for (unsigned t = 0; t < threads; ++t) {
          getcontext(&contexts[t]);
          contexts[t].uc_stack.ss_sp = stacks.get() + t * kStack;
          contexts[t].uc_stack.ss_size = kStack;
          contexts[t].uc_link = &emulated_scheduler;
          makecontext(&contexts[t], emulated_thread, 0);
          finished[t] = 0;
        }
        const unsigned n_warps = static_cast<unsigned>(warps.size());
        bool down = ((bx + by + bz) & 1) != 0;
        for (unsigned left = threads; left > 0; down = !down) {
          const unsigned long long before = emulated_progress;
          for (unsigned i = 0; i < n_warps; ++i) {
            const unsigned w = down ? n_warps - 1 - i : i;
            // The warp's lanes in turn until none moves on: each waits for the other warps at
            // __syncthreads, or has ended.
            for (bool lanes_down = down;; lanes_down = !lanes_down) {
              const unsigned long long warp_before = emulated_progress;
              for (unsigned l = 0; l < warps[w].count; ++l) {
                const unsigned t = 32 * w + (lanes_down ? warps[w].count - 1 - l : l);
                if (finished[t]) continue;
                threadIdx = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
                emulated_warp = &warps[w];
                emulated_block = &barrier;
                emulated_lane = t % 32;
                emulated_running = &contexts[t];
                emulated_finished = &finished[t];
                emulated_copies = &copies[t];
                swapcontext(&emulated_scheduler, &contexts[t]);
                if (finished[t]) {
                  --left;
                  if (!copies[t].empty()) {
                    std::fprintf(stderr, "emulated kernel: thread %u of block (%u, %u, %u) ended "
                                 "with asynchronous copies it never waited for\n", t, bx, by, bz);
                    std::abort();
                  }
                }
              }
              if (emulated_progress == warp_before) break;
            }
          }
          if (left > 0 && emulated_progress == before) {
            std::fprintf(stderr, "emulated kernel: the threads of block (%u, %u, %u) wait at "
                         "barriers that not all of them reach\n", bx, by, bz);
            std::abort();
          }
        }
        for (size_t i = dynamic_bytes; emulated_dynamic_poisoned && i < sizeof emulated_dynamic_bytes; ++i)
          if (emulated_dynamic_bytes[i] != 0xff) {
            std::fprintf(stderr, "emulated kernel: block (%u, %u, %u) wrote byte %zu of dynamic "
                         "shared memory; its launch gave it %zu\n", bx, by, bz, i, dynamic_bytes);
            std::abort();
          }
      }
}
inline void emulate_launch(EmulatedDim3 grid, EmulatedDim3 block, std::function<void()> kernel) {
  emulate_launch(grid, block, 0, std::move(kernel));
}
inline void emulate_launch(unsigned blocks, unsigned threads, size_t dynamic_bytes,
                           std::function<void()> kernel) {
  emulate_launch(EmulatedDim3{blocks, 1, 1}, EmulatedDim3{threads, 1, 1}, dynamic_bytes,
                 std::move(kernel));
}
inline void emulate_launch(unsigned blocks, unsigned threads, std::function<void()> kernel) {
  emulate_launch(blocks, threads, 0, std::move(kernel));
}
// Grids as launch plans spell them (CUDA's dim3, from the toolkit's vector_types.h).
inline void emulate_launch(dim3 grid, dim3 block, std::function<void()> kernel) {
  emulate_launch(EmulatedDim3{grid.x, grid.y, grid.z}, EmulatedDim3{block.x, block.y, block.z}, 0,
                 std::move(kernel));
}
)cuda";

// `name`_f32 or `name`_f64: the entry point a test's source defines for element type T.
template <typename T>
std::string typed_name(const char* name) {
  return cat(name, std::is_same_v<T, float> ? "_f32" : "_f64");
}

// Whether got is within `ulps` units in the last place of T, of 1 + magnitude, of want.
template <typename T>
bool within_ulps(double got, double want, double magnitude, double ulps) {
  const double ulp = std::is_same_v<T, float> ? 0x1p-23 : 0x1p-52;
  return std::abs(got - want) <= ulps * ulp * (1 + magnitude);
}

// Whether a and b hold the same bits (NaNs with their payloads).
template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// A device error slot (runtime/cuda.h: DeviceErrorSlot) in host memory, for the emulated
// kernels to report into (device_error.cuh), and what it recorded.
struct HostErrorSlot {
  unsigned claim = 0;
  long long record[4] = {0, 0, 0, 0};  // {kind << 32 | (op + 1), value, index, bound}
  cuda::DeviceErrorSlot slot() { return {&claim, record}; }
  long long kind() const { return record[0] >> 32; }
  long long op() const { return (record[0] & 0xffffffffLL) - 1; }
};

// CUDA source compiled for the host into a shared object and loaded: kCudaOnHost is included
// first, `files` (name, text) are written beside the source, and the source tree and CUDA's C++
// library (cuda/std/...) are on the include path. symbol() finds an extern "C" function of it.
class HostObject {
 public:
  HostObject(const std::vector<std::pair<std::string, std::string>>& files,
             const std::string& source) {
    std::string dir_template =
        (std::filesystem::temp_directory_path() / "encore_emulated_XXXXXX").string();
    if (mkdtemp(dir_template.data()) == nullptr) fail("emulated kernel: no temporary directory");
    dir_ = dir_template;
    try {
      build(files, source);
    } catch (...) {
      std::filesystem::remove_all(dir_);
      throw;
    }
  }
  ~HostObject() {
    if (handle_ != nullptr) dlclose(handle_);
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  HostObject(const HostObject&) = delete;
  HostObject& operator=(const HostObject&) = delete;

  void* symbol(const char* name) const {
    void* s = dlsym(handle_, name);
    if (s == nullptr) fail("emulated kernel: no entry point ", name);
    return s;
  }
  // The extern "C" function `name` of it, as a pointer of type Fn.
  template <typename Fn>
  Fn function(const std::string& name) const {
    return reinterpret_cast<Fn>(symbol(name.c_str()));
  }

 private:
  void build(const std::vector<std::pair<std::string, std::string>>& files,
             const std::string& source) {
    write(dir_ + "/cuda_on_host.h", kCudaOnHost);
    for (const auto& [name, text] : files) write(dir_ + "/" + name, text);
    write(dir_ + "/kernel.cc", source);
    const std::string so = dir_ + "/kernel.so";
    const std::string command =
        cat("'", ENCORE_TEST_CXX, "' -std=c++20 -O1 -ffp-contract=off -w -shared -fPIC -pthread ",
            "-include '", dir_, "/cuda_on_host.h' -I'", dir_, "' -I'", ENCORE_SOURCE_DIR, "' -I'",
            ENCORE_CUDA_CCCL_DIR, "' -I'", ENCORE_CUDA_CCCL_DIR, "/..' '", dir_, "/kernel.cc' -o '",
            so, "' 2>'", dir_, "/log.txt'");
    if (std::system(command.c_str()) != 0)
      fail("emulated kernel: the host compiler failed: ", read(dir_ + "/log.txt"));
    handle_ = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) fail("emulated kernel: ", dlerror());
  }
  static void write(const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
  }
  static std::string read(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::string dir_;
  void* handle_ = nullptr;
};

// Fused programs' kernels, compiled for the host together (one compile: the host compiler's
// start-up is most of a small program's cost); run(k, ...) launches program k's over buffers.
class EmulatedKernels {
 public:
  explicit EmulatedKernels(const std::vector<FusedProgram>& programs)
      : object_({{kernels::cuda::kElementOpsInclude, kernels::cuda::element_ops_text()}},
                source(programs)) {
    for (size_t k = 0; k < programs.size(); ++k) {
      sizes_.push_back({programs[k].n_in, programs[k].n_out});
      runs_.push_back(object_.function<Run>(cat("encore_emulated_", k)));
    }
  }

  // Launches program k's kernel on `blocks` blocks with count n (elements, or rows for row
  // programs) over the inputs, then the outputs.
  void run(size_t k, unsigned blocks, unsigned long long n,
           const std::vector<void*>& buffers) const {
    const auto [n_in, n_out] = sizes_.at(k);
    if (static_cast<int>(buffers.size()) != n_in + n_out)
      fail("emulated kernel: ", buffers.size(), " buffers for ", n_in, " inputs and ", n_out,
           " outputs");
    runs_[k](blocks, n, buffers.data());
  }

 private:
  using Run = void (*)(unsigned, unsigned long long, void* const*);
  // The programs' kernels and an entry point launching each.
  static std::string source(const std::vector<FusedProgram>& programs) {
    std::string s = kernels::cuda::fused_prelude();
    for (size_t k = 0; k < programs.size(); ++k) {
      const FusedProgram& p = programs[k];
      const char* t = p.dtype == DType::Float32 ? "float" : "double";
      std::string call = cat("encore_fused_", k, "(n");
      for (int i = 0; i < p.n_in; ++i)
        call += cat(", (const ", p.reads_bool(i) ? "unsigned char" : t, "*)ptrs[", i, "]");
      for (int i = 0; i < p.n_out; ++i) call += cat(", (", t, "*)ptrs[", p.n_in + i, "]");
      s += cat(kernels::cuda::fused_kernel_source(p, cat("encore_fused_", k)),
               "extern \"C\" void encore_emulated_", k,
               "(unsigned blocks, unsigned long long n, void* const* ptrs) {\n  emulate_launch(",
               "blocks, ", kernels::cuda::kFusedThreads, ", [&] { ", call, "); });\n}\n");
    }
    return s;
  }
  HostObject object_;
  std::vector<std::pair<int, int>> sizes_;
  std::vector<Run> runs_;
};

}  // namespace encore::testing
