// ENCORE_HOST_DEVICE marks a function that CUDA device code shares with the host (Philox, the
// uniform mapping, pooling geometry); outside nvcc it expands to nothing.
#pragma once

#ifdef __CUDACC__
#define ENCORE_HOST_DEVICE __host__ __device__
#else
#define ENCORE_HOST_DEVICE
#endif
