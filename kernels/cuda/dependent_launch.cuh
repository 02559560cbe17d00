// Programmatic dependent launch (sm_90 and later), for the kernels of a chain of small launches
// (the small GEMMs, the cross-entropy gradient, the optimizer updates): a kernel launched as a
// programmatic dependent of the kernel before it on its stream (launch_dependent, common.cuh)
// starts launching while that kernel runs, so that the launch overlaps its work. Each such kernel
// calls dependent_launch_start before it reads or writes anything. Host-compilable (the emulated
// kernel tests), where it does nothing.
#pragma once

namespace encore::kernels::cuda {

// Lets the next kernel on the stream launch now, then waits until the kernels this one depends
// on have finished and their writes are seen. Launched the usual way (or compiled for a GPU before
// sm_90), both do nothing.
__device__ __forceinline__ void dependent_launch_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

}  // namespace encore::kernels::cuda
