// Runs CUDA kernels on the host: a fused program's generated kernel (fused_source.h) with
// element_ops.cuh, or a kernel header of our own (HostObject: small_gemm.cuh), compiled by the
// host's C++ compiler against a header that stands in for the CUDA built-ins (threadIdx, blockIdx,
// gridDim, blockDim, the warp shuffles, 64-bit atomics, the bit casts), and launched as a grid of
// blocks of threads, each a std::thread; the 32 threads of a warp meet at a barrier for each
// shuffle. It checks what a kernel computes where (indices, layouts, folds, the warp tree, which
// lane writes), not the device's rounding: the host's libm stands in for CUDA's.
#pragma once

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/fused_source.h"
#include "runtime/error.h"
#include "runtime/fused.h"

namespace encore::testing {

// The CUDA built-ins the generated kernels and element_ops.cuh use, for the host.
inline constexpr const char* kCudaOnHost = R"cuda(
#pragma once
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(n)
struct EmulatedDim3 { unsigned x = 0, y = 0, z = 0; };
// Internal linkage: each kernel's shared object has its own.
static thread_local EmulatedDim3 threadIdx, blockIdx;
static EmulatedDim3 gridDim, blockDim;
// The 32 threads of a warp meet here at each shuffle. A kernel whose lanes do not all reach one
// (a shuffle in divergent code) would wait for ever: after 60 s the process aborts, saying so.
struct EmulatedWarp {
  std::atomic<unsigned> arrived{0}, round{0};
  alignas(8) unsigned char slot[32][8];
  void meet() {
    const unsigned r = round.load();
    if (arrived.fetch_add(1) == 31) {
      arrived.store(0);
      round.fetch_add(1);
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (round.load() == r) {
      if (std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "emulated kernel: a warp's lanes did not all reach a shuffle\n");
        std::abort();
      }
      std::this_thread::yield();
    }
  }
};
static thread_local EmulatedWarp* emulated_warp = nullptr;
template <typename T>
T emulated_exchange(T v, int from) {
  const unsigned lane = threadIdx.x % 32;
  std::memcpy(emulated_warp->slot[lane], &v, sizeof(T));
  emulated_warp->meet();
  T r;
  std::memcpy(&r, emulated_warp->slot[from], sizeof(T));
  emulated_warp->meet();
  return r;
}
template <typename T>
T __shfl_xor_sync(unsigned, T v, int o) { return emulated_exchange(v, (threadIdx.x % 32) ^ o); }
template <typename T>
T __shfl_sync(unsigned, T v, int src) { return emulated_exchange(v, src); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return std::atomic_ref<unsigned long long>(*p).fetch_add(v);
}
inline unsigned long long atomicExch(unsigned long long* p, unsigned long long v) {
  return std::atomic_ref<unsigned long long>(*p).exchange(v);
}
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
// Runs kernel(...) on `blocks` blocks of `threads` threads.
template <typename Kernel>
void emulate_launch(unsigned blocks, unsigned threads, Kernel kernel) {
  gridDim = {blocks, 1, 1};
  blockDim = {threads, 1, 1};
  for (unsigned b = 0; b < blocks; ++b) {
    std::vector<EmulatedWarp> warps((threads + 31) / 32);  // not moved once threads run
    std::vector<std::thread> all;
    for (unsigned t = 0; t < threads; ++t)
      all.emplace_back([&, b, t] {
        blockIdx = {b, 0, 0};
        threadIdx = {t, 0, 0};
        emulated_warp = &warps[t / 32];
        kernel();
      });
    for (std::thread& t : all) t.join();
  }
}
)cuda";

// CUDA source compiled for the host into a shared object and loaded: kCudaOnHost is included
// first, `files` (name, text) are written beside the source, and `include_dir` (if any) is on the
// include path. symbol() finds an extern "C" function of it.
class HostObject {
 public:
  HostObject(const std::vector<std::pair<std::string, std::string>>& files,
             const std::string& source, const std::string& include_dir = "") {
    std::string dir_template =
        (std::filesystem::temp_directory_path() / "encore_emulated_XXXXXX").string();
    if (mkdtemp(dir_template.data()) == nullptr) fail("emulated kernel: no temporary directory");
    dir_ = dir_template;
    try {
      build(files, source, include_dir);
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

 private:
  void build(const std::vector<std::pair<std::string, std::string>>& files,
             const std::string& source, const std::string& include_dir) {
    write(dir_ + "/cuda_on_host.h", kCudaOnHost);
    for (const auto& [name, text] : files) write(dir_ + "/" + name, text);
    write(dir_ + "/kernel.cc", source);
    const std::string so = dir_ + "/kernel.so";
    const std::string extra = include_dir.empty() ? "" : cat(" -I'", include_dir, "'");
    const std::string command =
        cat("'", ENCORE_TEST_CXX, "' -std=c++20 -O1 -w -shared -fPIC -pthread ", "-include '", dir_,
            "/cuda_on_host.h' -I'", dir_, "'", extra, " '", dir_, "/kernel.cc' -o '", so, "' 2>'",
            dir_, "/log.txt'");
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

// A fused program's kernel, compiled for the host; run() launches it over buffers.
class EmulatedKernel {
 public:
  explicit EmulatedKernel(const FusedProgram& p)
      : n_in_(p.n_in),
        n_out_(p.n_out),
        object_({{kernels::cuda::kElementOpsInclude, kernels::cuda::element_ops_text()}},
                source(p)),
        run_(reinterpret_cast<Run>(object_.symbol("encore_emulated"))) {}

  // Launches the kernel on `blocks` blocks with count n (elements, or rows for row programs) over
  // the inputs, then the outputs.
  void run(unsigned blocks, unsigned long long n, const std::vector<void*>& buffers) const {
    if (static_cast<int>(buffers.size()) != n_in_ + n_out_)
      fail("emulated kernel: ", buffers.size(), " buffers for ", n_in_, " inputs and ", n_out_,
           " outputs");
    run_(blocks, n, buffers.data());
  }

 private:
  using Run = void (*)(unsigned, unsigned long long, void* const*);
  // The program's kernel and an entry point launching it.
  static std::string source(const FusedProgram& p) {
    const char* t = p.dtype == DType::Float32 ? "float" : "double";
    std::string call = "encore_fused(n";
    for (int k = 0; k < p.n_in; ++k)
      call += cat(", (const ", p.reads_bool(k) ? "unsigned char" : t, "*)ptrs[", k, "]");
    for (int k = 0; k < p.n_out; ++k) call += cat(", (", t, "*)ptrs[", p.n_in + k, "]");
    return cat(kernels::cuda::fused_source(p),
               "extern \"C\" void encore_emulated(unsigned blocks, unsigned long long n, "
               "void* const* ptrs) {\n  emulate_launch(blocks, ",
               kernels::cuda::kFusedThreads, ", [&] { ", call, "); });\n}\n");
  }
  int n_in_, n_out_;
  HostObject object_;
  Run run_;
};

}  // namespace encore::testing
