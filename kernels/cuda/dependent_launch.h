// Which launches may be programmatic dependents (dependent_launch.cuh; common.cuh's
// launch_dependent asks these). Host code: dependent_launch.cc.
#pragma once

namespace encore::kernels::cuda {

// Whether launches on `device` may be programmatic dependents: ENCORE_CUDA_PDL=1 (read once; off
// by default until timed) and compute capability 9.0 or later.
bool programmatic_device(int device);

// Whether `kernel`'s code was compiled from compute_90 PTX or later: code for older GPUs does not
// wait in dependent_launch_start, and must not be launched as a dependent.
bool waits_as_dependent(const void* kernel);

}  // namespace encore::kernels::cuda
