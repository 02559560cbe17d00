// V elements of T moved as one vector (a load or store of sizeof(T) * V bytes): the elementwise
// map's 16-byte steps (elementwise.cuh); aligned_for also says where the small GEMMs may stage
// 16-byte vectors (small_gemm.cuh).
// Host-compilable (the emulated kernel tests).
#pragma once

#include <cstdint>

namespace encore::kernels::cuda {

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// Whether p may be read or written as Packs of V.
template <typename T, int V>
bool aligned_for(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * V) == 0;
}

}  // namespace encore::kernels::cuda
