// FusedElementwise on CUDA (runtime/fused.h): a run of elementwise steps (and row ops) of a CUDA
// plan as one kernel, generated from its program (fused_source.h) and compiled with NVRTC
// (nvrtc.h) when the plan is made, all of a plan's new programs in one NVRTC compile. Kernels are
// cached for the life of the process by compute capability and source, so two runs or plans with
// the same program (a repeated cell, a retrace, another model) share one. The step's kernel
// then launches the compiled kernel with its buffers: no lookup, lock or allocation.
#include <algorithm>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fused_source.h"
#include "kernels/cuda/nvrtc.h"
#include "runtime/fused.h"

namespace encore::kernels::cuda {
namespace {

// A compiled program, or why it could not be (`lasting`: an error a later plan would meet again,
// a source NVRTC rejects; a load that failed for want of memory, or an NVRTC failure that is not
// the source's, is tried again).
struct Compiled {
  cudaKernel_t kernel = nullptr;
  std::string error;
  bool lasting = true;
};

// Why a runtime call failed, clearing the thread's last error (else the next kernel's launch
// check would report it under its own name).
std::string load_failure(const std::string& what, cudaError_t e) {
  (void)cudaGetLastError();
  return cat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

// Compiles kernels[k] (each following the prelude, named names[k]) in one NVRTC program and loads
// it; per kernel, the loaded kernel or why not. One compile pays NVRTC's fixed cost once for a
// whole plan. Loaded libraries are never unloaded: a plan's kernel, or a graph that captured it,
// may run until the process ends.
std::vector<Compiled> compile(const std::vector<std::string>& kernels,
                              const std::vector<std::string>& names, int arch) {
  std::vector<Compiled> out(kernels.size());
  std::string source = fused_prelude();
  for (const std::string& k : kernels) source += k;
  try {
    const std::string cubin = nvrtc_compile(source, arch);
    cudaLibrary_t library = nullptr;
    cudaError_t loaded = cudaSuccess;
    // Loading may synchronise the context, which another thread's capture may not meet.
    encore::cuda::outside_captures([&] {
      loaded =
          cudaLibraryLoadData(&library, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
    });
    for (size_t k = 0; k < kernels.size(); ++k) {
      cudaError_t e = loaded;
      if (e == cudaSuccess) e = cudaLibraryGetKernel(&out[k].kernel, library, names[k].c_str());
      if (e != cudaSuccess) {
        out[k].kernel = nullptr;
        out[k].error = load_failure("the compiled fused kernel does not load", e);
        out[k].lasting = e != cudaErrorMemoryAllocation;
      }
    }
  } catch (const NvrtcRejected& e) {  // a source NVRTC refuses: for good
    if (kernels.size() == 1) {
      out[0].error = e.what();
    } else {  // find which: each on its own
      for (size_t k = 0; k < kernels.size(); ++k)
        out[k] = compile({kernels[k]}, {names[k]}, arch)[0];
    }
  } catch (const Error& e) {  // not the sources' doing (NVRTC out of memory): a later plan retries
    for (Compiled& c : out) {
      c.kernel = nullptr;
      c.error = e.what();
      c.lasting = false;
    }
  }
  return out;
}

std::vector<std::string> prepare(std::span<FusedProgram* const> programs, Device device) {
  std::vector<std::string> why(programs.size());
  auto all = [&](const std::string& reason) {
    std::fill(why.begin(), why.end(), reason);
    return why;
  };
  if (const std::string& reason = nvrtc_unavailable(); !reason.empty()) return all(reason);
  int major = 0, minor = 0;
  cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device.index);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device.index);
  if (e != cudaSuccess)
    return all(load_failure(cat("the compute capability of ", device.str(), " cannot be read"), e));
  const int arch = 10 * major + minor;
  const encore::cuda::DeviceGuard on(device.index);  // the kernels load into its context

  // Per process, by capability and kernel source (named kFusedKernelName in the key). Looked up
  // under the lock, compiled and loaded outside it: another thread's plan need not wait for
  // NVRTC, nor for a capture the load waits for. Two threads that compile one program at once
  // each compile it; the first kept is the one both use (as plan_cache.h).
  static std::mutex mu;
  static absl::flat_hash_map<std::string, Compiled> cache;
  std::vector<std::string> keys(programs.size());
  std::vector<std::string> kernels, names, new_keys;
  std::vector<Compiled> found(programs.size());
  {
    const std::lock_guard<std::mutex> lock(mu);
    for (size_t k = 0; k < programs.size(); ++k) {
      if (std::string reason = fused_unsupported(*programs[k]); !reason.empty()) {
        why[k] = std::move(reason);
        continue;
      }
      keys[k] = cat(arch, "\n", fused_kernel_source(*programs[k], kFusedKernelName));
      if (const auto it = cache.find(keys[k]); it != cache.end()) {
        found[k] = it->second;
        continue;
      }
      if (std::find(new_keys.begin(), new_keys.end(), keys[k]) != new_keys.end()) continue;
      names.push_back(cat(kFusedKernelName, "_", kernels.size()));
      kernels.push_back(fused_kernel_source(*programs[k], names.back()));
      new_keys.push_back(keys[k]);
    }
  }
  std::vector<Compiled> compiled;
  if (!kernels.empty()) compiled = compile(kernels, names, arch);
  {
    const std::lock_guard<std::mutex> lock(mu);
    for (size_t k = 0; k < compiled.size(); ++k)
      if (compiled[k].lasting)
        compiled[k] = cache.try_emplace(new_keys[k], compiled[k]).first->second;
  }
  auto compiled_for = [&](size_t k) -> const Compiled& {
    if (const auto it = std::find(new_keys.begin(), new_keys.end(), keys[k]); it != new_keys.end())
      return compiled[static_cast<size_t>(it - new_keys.begin())];
    return found[k];
  };
  for (size_t k = 0; k < programs.size(); ++k) {
    if (keys[k].empty()) continue;
    const Compiled& c = compiled_for(k);
    why[k] = c.error;
    if (c.kernel == nullptr) continue;
    // Loaded into this device's context now (a cached kernel too: another device may have loaded
    // it): with lazy loading it would load at its first launch, which is a graph capture when
    // the plan replays as CUDA graphs.
    cudaFuncAttributes attributes;
    encore::cuda::outside_captures(
        [&] { e = cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(c.kernel)); });
    if (e != cudaSuccess) {
      why[k] = load_failure(cat("the compiled fused kernel does not load on ", device.str()), e);
      continue;
    }
    programs[k]->device_kernel = c.kernel;
  }
  return why;
}

// The element count (or the row count), then the inputs, then the outputs: the generated
// kernel's parameters.
void fused_kernel(const KernelArgs& args) {
  const FusedProgram& p = *args.attr<FusedAttrs>().program;
  if (p.device_kernel == nullptr)
    fail("fused_elementwise: the program of ", p.n_in, " inputs and ", p.n_out, " outputs over ",
         p.numel, " elements has no compiled kernel (its plan did not prepare it)");
  // The generated kernel takes exactly the program's buffers (past them the parameter arrays
  // below would overflow).
  ENCORE_CHECK(
      static_cast<int>(args.in.size()) == p.n_in && static_cast<int>(args.out.size()) == p.n_out,
      "fused_elementwise: ", args.in.size(), " inputs and ", args.out.size(),
      " outputs given to a program of ", p.n_in, " inputs and ", p.n_out, " outputs");
  // A program with row ops runs a warp per row (kFusedRowsPerBlock a block), else a thread per
  // element.
  const int64_t items = p.row_ops ? p.numel / p.row : p.numel;
  unsigned long long n = static_cast<unsigned long long>(items);
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
  ENCORE_CUDA_OK(
      Op::FusedElementwise,
      cudaLaunchKernel(p.device_kernel,
                       dim3(blocks_for(items, p.row_ops ? kFusedRowsPerBlock : kFusedThreads)),
                       dim3(kFusedThreads), params, 0, stream()));
}

[[maybe_unused]] const bool kRegistered = [] {
  register_kernel(Op::FusedElementwise, DeviceType::CUDA, &fused_kernel);
  register_fused_prepare(DeviceType::CUDA, &prepare);
  return true;
}();

}  // namespace
}  // namespace encore::kernels::cuda
