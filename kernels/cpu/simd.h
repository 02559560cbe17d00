// The few SIMD loops the compiler will not write for us.
//
// GCC vectorizes std::sqrt only under -fno-math-errno (errno for a negative argument is a
// side effect), so sqrt_array spells the vector forms out. sqrt is correctly rounded, so
// results equal std::sqrt's on every path. (256-bit even where AVX-512 exists: the loops are
// memory-bound, and GCC 12's _mm512_sqrt_* trip -Wmaybe-uninitialized.)
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace encore::kernels::cpu {

// y[i] = sqrt(x[i]) for i < n; y may equal x.
inline void sqrt_array(const float* x, float* y, int64_t n) {
  int64_t i = 0;
#if defined(__AVX__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
#elif defined(__SSE2__)
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(y + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) y[i] = std::sqrt(x[i]);
}

inline void sqrt_array(const double* x, double* y, int64_t n) {
  int64_t i = 0;
#if defined(__AVX__)
  for (; i + 4 <= n; i += 4) _mm256_storeu_pd(y + i, _mm256_sqrt_pd(_mm256_loadu_pd(x + i)));
#elif defined(__SSE2__)
  for (; i + 2 <= n; i += 2) _mm_storeu_pd(y + i, _mm_sqrt_pd(_mm_loadu_pd(x + i)));
#endif
  for (; i < n; ++i) y[i] = std::sqrt(x[i]);
}

}  // namespace encore::kernels::cpu
