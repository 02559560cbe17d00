// FusedElementwise on CUDA (runtime/fused.h): a run of elementwise steps of a CUDA plan as one
// kernel, generated from its program (fused_source.h) and compiled with NVRTC (nvrtc.h) when the
// plan is made. Kernels are cached for the life of the process by compute capability and source,
// so two plans with the same program (a retrace, another model) share one. The step's kernel
// then launches the compiled kernel with its buffers: no lookup, lock or allocation.
#include <mutex>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fused_source.h"
#include "kernels/cuda/nvrtc.h"
#include "runtime/fused.h"

namespace encore::kernels::cuda {
namespace {

// A compiled program, or why it could not be.
struct Compiled {
  cudaKernel_t kernel = nullptr;
  std::string error;
};

Compiled compile(const std::string& source, int arch) {
  Compiled c;
  try {
    const std::string cubin = nvrtc_compile(source, arch);
    cudaLibrary_t library = nullptr;
    cudaError_t e =
        cudaLibraryLoadData(&library, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
    if (e == cudaSuccess) e = cudaLibraryGetKernel(&c.kernel, library, kFusedKernelName);
    if (e != cudaSuccess) {
      c.kernel = nullptr;
      c.error = cat("the compiled fused kernel does not load: ", cudaGetErrorName(e), " (",
                    cudaGetErrorString(e), ")");
    }
  } catch (const Error& e) {
    c.error = e.what();
  }
  return c;
}

std::string prepare(FusedProgram& p, Device device) {
  if (std::string why = fused_unsupported(p); !why.empty()) return why;
  if (const std::string& why = nvrtc_unavailable(); !why.empty()) return why;
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device.index) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device.index) !=
          cudaSuccess)
    return cat("the compute capability of ", device.str(), " cannot be read");
  const int arch = 10 * major + minor;
  std::string source = fused_source(p);
  // Loaded libraries are never unloaded: a plan's kernel, or a graph that captured it, may run
  // until the process ends.
  static std::mutex mu;
  static absl::flat_hash_map<std::string, Compiled> cache;
  const std::lock_guard<std::mutex> lock(mu);
  std::string key = cat(arch, "\n", source);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(std::move(key), compile(source, arch)).first;
  p.device_kernel = it->second.kernel;
  return it->second.error;
}

// The element count, then the inputs, then the outputs: the generated kernel's parameters.
void fused_kernel(const KernelArgs& args) {
  const FusedProgram& p = *args.attr<FusedAttrs>().program;
  if (p.device_kernel == nullptr)
    fail("fused_elementwise: the program has no compiled kernel (its plan did not prepare it)");
  unsigned long long n = static_cast<unsigned long long>(p.numel);
  if (n == 0) return;
  constexpr int kMaxParams = 1 + FusedProgram::kMaxInputs + FusedProgram::kMaxSteps;
  void* pointers[kMaxParams];
  void* params[kMaxParams];
  int k = 0;
  params[k++] = &n;
  for (const BufferView& b : args.in) {
    pointers[k] = b.data;
    params[k] = &pointers[k];
    ++k;
  }
  for (const BufferView& b : args.out) {
    pointers[k] = b.data;
    params[k] = &pointers[k];
    ++k;
  }
  ENCORE_CUDA_OK(Op::FusedElementwise, cudaLaunchKernel(p.device_kernel, dim3(blocks_for(p.numel)),
                                                        dim3(kThreads), params, 0, stream()));
}

[[maybe_unused]] const bool kRegistered = [] {
  register_kernel(Op::FusedElementwise, DeviceType::CUDA, &fused_kernel);
  register_fused_prepare(DeviceType::CUDA, &prepare);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cuda
