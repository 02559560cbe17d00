// NVRTC through dlopen (nvrtc.h).
#include "kernels/cuda/nvrtc.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nvrtc.h>

#include <cstdlib>
#include <iterator>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/fused_source.h"
#include "runtime/error.h"

namespace encore::kernels::cuda {
namespace {

// The NVRTC entry points encore calls.
struct Api {
  std::string unavailable;
  decltype(&nvrtcCreateProgram) create = nullptr;
  decltype(&nvrtcDestroyProgram) destroy = nullptr;
  decltype(&nvrtcCompileProgram) compile = nullptr;
  decltype(&nvrtcGetProgramLogSize) log_size = nullptr;
  decltype(&nvrtcGetProgramLog) log = nullptr;
  decltype(&nvrtcGetCUBINSize) cubin_size = nullptr;
  decltype(&nvrtcGetCUBIN) cubin = nullptr;
  decltype(&nvrtcGetErrorString) error_string = nullptr;
  decltype(&nvrtcVersion) version = nullptr;
};

// Where NVRTC may be: $ENCORE_NVRTC, the loader's path, beside the cuBLAS this process loaded
// (the toolkit's lib64, or a wheel's lib folder), the toolkit's default place.
std::vector<std::string> candidates() {
  std::vector<std::string> names;
  if (const char* env = std::getenv("ENCORE_NVRTC"); env != nullptr && *env != '\0')
    names.emplace_back(env);
  names.emplace_back("libnvrtc.so.13");
  names.emplace_back("libnvrtc.so");
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cublasCreate_v2), &info) != 0 && info.dli_fname != nullptr) {
    const std::string cublas = info.dli_fname;
    if (const size_t slash = cublas.rfind('/'); slash != std::string::npos)
      names.push_back(cublas.substr(0, slash + 1) + "libnvrtc.so.13");
  }
  names.emplace_back("/usr/local/cuda/lib64/libnvrtc.so.13");
  return names;
}

// The first candidate that loads, has every entry point encore calls, and is the release the
// unfused kernels were built with (another release's compiler and math library may round
// differently, and fused steps must give their bits); a candidate that fails is closed and the
// next one tried.
Api load() {
  constexpr int kMajor = CUDART_VERSION / 1000, kMinor = CUDART_VERSION % 1000 / 10;
  std::string tried;
  for (const std::string& name : candidates()) {
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      tried += cat(tried.empty() ? "" : ", ", name);
      continue;
    }
    Api api;
    bool missing = false;
    auto get = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
      missing |= fn == nullptr;
    };
    get(api.create, "nvrtcCreateProgram");
    get(api.destroy, "nvrtcDestroyProgram");
    get(api.compile, "nvrtcCompileProgram");
    get(api.log_size, "nvrtcGetProgramLogSize");
    get(api.log, "nvrtcGetProgramLog");
    get(api.cubin_size, "nvrtcGetCUBINSize");
    get(api.cubin, "nvrtcGetCUBIN");
    get(api.error_string, "nvrtcGetErrorString");
    get(api.version, "nvrtcVersion");
    int major = 0, minor = 0;
    if (missing) {
      tried += cat(tried.empty() ? "" : ", ", name, " (it lacks an entry point encore calls)");
    } else if (api.version(&major, &minor) != NVRTC_SUCCESS || major != kMajor || minor != kMinor) {
      tried += cat(tried.empty() ? "" : ", ", name, " (release ", major, ".", minor, ")");
    } else {
      return api;  // (kept loaded for the process)
    }
    dlclose(lib);
  }
  Api none;
  none.unavailable = cat("no NVRTC of the CUDA ", kMajor, ".", kMinor,
                         " release the unfused kernels were built with can be loaded (tried ",
                         tried, "; ENCORE_NVRTC may name the library)");
  return none;
}

const Api& api() {
  static const Api loaded = load();
  return loaded;
}

}  // namespace

const std::string& nvrtc_unavailable() {
  return api().unavailable;
}

std::string nvrtc_compile(const std::string& source, int arch) {
  const Api& nv = api();
  if (!nv.unavailable.empty()) fail("fused_elementwise: ", nv.unavailable);
  auto check = [&](nvrtcResult r, const char* call) {
    if (r != NVRTC_SUCCESS)
      fail("fused_elementwise: NVRTC error in ", call, ": ", nv.error_string(r));
  };
  nvrtcProgram prog = nullptr;
  const char* header = element_ops_text();
  const char* header_name = kElementOpsInclude;
  check(nv.create(&prog, source.c_str(), "encore_fused.cu", 1, &header, &header_name),
        "nvrtcCreateProgram");
  const std::unique_ptr<nvrtcProgram, void (*)(nvrtcProgram*)> owner(
      &prog, [](nvrtcProgram* p) { api().destroy(p); });
  const std::string gpu_arch = cat("--gpu-architecture=sm_", arch);
  const char* options[] = {gpu_arch.c_str(),  "--std=c++17",      "--fmad=false",
                           "--prec-div=true", "--prec-sqrt=true", "--ftz=false"};
  const nvrtcResult compiled = nv.compile(prog, std::size(options), options);
  if (compiled != NVRTC_SUCCESS) {
    size_t n = 0;
    std::string log;
    if (nv.log_size(prog, &n) == NVRTC_SUCCESS && n > 1) {
      log.resize(n);
      if (nv.log(prog, log.data()) != NVRTC_SUCCESS) log.clear();
      while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
    }
    const std::string what =
        cat("fused_elementwise: NVRTC could not compile the fused kernel for sm_", arch, " (",
            nv.error_string(compiled), "): ", log, "\nsource:\n", source);
    if (compiled == NVRTC_ERROR_COMPILATION) throw NvrtcRejected(what);
    throw Error(what);
  }
  size_t n = 0;
  check(nv.cubin_size(prog, &n), "nvrtcGetCUBINSize");
  std::string cubin(n, '\0');
  check(nv.cubin(prog, cubin.data()), "nvrtcGetCUBIN");
  return cubin;
}

}  // namespace encore::kernels::cuda
