// The shifted GEMM behind stride-1 convolutions (conv.cc): vectors of the widest width the target
// has, register tiles of the product out[m][q] = sum_k a[m][k] b[off[k] + q] and of the weight
// gradient's dot products, row copies into padded planes, and the layout of one image's padded
// copy and wide result. Each output element is summed in a fixed order (tap by tap; the weight
// gradient's lanes pairwise), so the bits do not depend on how the work is split.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace encore::kernels::cpu::shifted {

// ---- Vectors (GCC/Clang vector extensions; the widest the target has) ---------------------

#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
#elif defined(__AVX__)
constexpr int kVecBytes = 32;
#else
constexpr int kVecBytes = 16;
#endif

template <typename T>
struct VecOf;
template <>
struct VecOf<float> {
  typedef float type __attribute__((vector_size(kVecBytes)));
};
template <>
struct VecOf<double> {
  typedef double type __attribute__((vector_size(kVecBytes)));
};
template <typename T>
using Vec = typename VecOf<T>::type;
template <typename T>
constexpr int kLanes = kVecBytes / static_cast<int>(sizeof(T));

template <typename T>
inline Vec<T> load(const T* p) {
  Vec<T> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename T>
inline void store(T* p, const Vec<T>& v) {
  std::memcpy(p, &v, sizeof v);
}
// The lanes summed pairwise (a fixed order).
template <typename T>
inline T horizontal_sum(const Vec<T>& v) {
  T lanes[kLanes<T>];
  std::memcpy(lanes, &v, sizeof v);
  for (int half = kLanes<T> / 2; half > 0; half /= 2)
    for (int i = 0; i < half; ++i) lanes[i] += lanes[i + half];
  return lanes[0];
}

// ---- Shifted GEMM ---------------------------------------------------------------------------

// Register tiles: accumulators plus the vectors and broadcasts they read must fit the vector
// registers (32 with AVX-512, 16 below).
constexpr int kTileVecs = 2;                        // vectors of output pixels per tile
constexpr int kTileRows = kVecBytes == 64 ? 8 : 6;  // output channels per tile
constexpr int kDotRows = kVecBytes == 64 ? 8 : 3;   // weight gradient: output channels per tile
constexpr int kDotTaps = 3;                         // weight gradient: taps per tile
template <typename T>
constexpr int64_t kTile = kTileVecs* kLanes<T>;

// out[m][0, kTile) = sum_k a[m lda + k] b[off[k], + kTile) for m < MB.
template <typename T, int MB>
inline void shifted_tile(const T* a, int64_t lda, const T* b, const int64_t* off, int64_t taps,
                         T* out, int64_t ldo) {
  constexpr int L = kLanes<T>;
  Vec<T> acc[MB][kTileVecs] = {};
  for (int64_t k = 0; k < taps; ++k) {
    const T* bk = b + off[k];
    Vec<T> bv[kTileVecs];
    for (int v = 0; v < kTileVecs; ++v) bv[v] = load(bk + v * L);
    for (int m = 0; m < MB; ++m) {
      const T am = a[m * lda + k];
      for (int v = 0; v < kTileVecs; ++v) acc[m][v] += am * bv[v];
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int v = 0; v < kTileVecs; ++v) store(out + m * ldo + v * L, acc[m][v]);
}

// One row block of shifted_gemm: rows <= MB.
template <typename T, int MB>
void shifted_rows(const T* a, int64_t lda, int64_t rows, const T* b, const int64_t* off,
                  int64_t taps, T* out, int64_t ldo) {
  if constexpr (MB > 1) {
    if (rows < MB) return shifted_rows<T, MB - 1>(a, lda, rows, b, off, taps, out, ldo);
  }
  shifted_tile<T, MB>(a, lda, b, off, taps, out, ldo);
}

// out[m][q] = sum_k a[m lda + k] b[off[k] + q] for m < rows, q < width (a multiple of kTile).
template <typename T>
void shifted_gemm(const T* a, int64_t lda, int64_t rows, const T* b, const int64_t* off,
                  int64_t taps, T* out, int64_t ldo, int64_t width) {
  for (int64_t q = 0; q < width; q += kTile<T>)
    for (int64_t m = 0; m < rows; m += kTileRows)
      shifted_rows<T, kTileRows>(a + m * lda, lda, std::min<int64_t>(kTileRows, rows - m), b + q,
                                 off, taps, out + m * ldo + q, ldo);
}

// gw[m ldw + k] += sum over images i < count of sum_q gy[i gy_image + m ldg + q]
// b[i b_image + off[k] + q], for m < MB, k < KB, q < width (a multiple of the lane count).
template <typename T, int MB, int KB>
inline void shifted_dot_tile(const T* gy, int64_t ldg, int64_t gy_image, const T* b,
                             int64_t b_image, int64_t count, const int64_t* off, int64_t width,
                             T* gw, int64_t ldw) {
  constexpr int L = kLanes<T>;
  Vec<T> acc[MB][KB] = {};
  for (int64_t i = 0; i < count; ++i) {
    const T* bk[KB];
    for (int k = 0; k < KB; ++k) bk[k] = b + i * b_image + off[k];
    const T* gi = gy + i * gy_image;
    for (int64_t q = 0; q < width; q += L) {
      Vec<T> gv[MB];
      for (int m = 0; m < MB; ++m) gv[m] = load(gi + m * ldg + q);
      for (int k = 0; k < KB; ++k) {
        const Vec<T> xv = load(bk[k] + q);
        for (int m = 0; m < MB; ++m) acc[m][k] += gv[m] * xv;
      }
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int k = 0; k < KB; ++k) gw[m * ldw + k] += horizontal_sum<T>(acc[m][k]);
}

// One weight-gradient tile: rows [0, rows) and taps [0, taps), at most MB and KB.
template <typename T, int MB, int KB>
void shifted_dot(const T* gy, int64_t ldg, int64_t gy_image, int64_t rows, const T* b,
                 int64_t b_image, int64_t count, const int64_t* off, int64_t taps, int64_t width,
                 T* gw, int64_t ldw) {
  if constexpr (MB > 1) {
    if (rows < MB)
      return shifted_dot<T, MB - 1, KB>(gy, ldg, gy_image, rows, b, b_image, count, off, taps,
                                        width, gw, ldw);
  }
  if constexpr (KB > 1) {
    if (taps < KB)
      return shifted_dot<T, MB, KB - 1>(gy, ldg, gy_image, rows, b, b_image, count, off, taps,
                                        width, gw, ldw);
  }
  shifted_dot_tile<T, MB, KB>(gy, ldg, gy_image, b, b_image, count, off, width, gw, ldw);
}

// n values from s to d (not overlapping), in vectors.
template <typename T>
inline void copy_row(T* d, const T* s, int64_t n) {
  constexpr int L = kLanes<T>;
  if (n < L) {
    for (int64_t i = 0; i < n; ++i) d[i] = s[i];
    return;
  }
  for (int64_t i = 0; i + L <= n; i += L) store(d + i, load(s + i));
  store(d + n - L, load(s + n - L));  // the tail, overlapping the last full vector
}

// d[i] = s[i] + b for i < n (not overlapping), in vectors.
template <typename T>
inline void add_row(T* d, const T* s, int64_t n, T b) {
  constexpr int L = kLanes<T>;
  if (n < L) {
    for (int64_t i = 0; i < n; ++i) d[i] = s[i] + b;
    return;
  }
  for (int64_t i = 0; i + L <= n; i += L) store(d + i, load(s + i) + b);
  store(d + n - L, load(s + n - L) + b);
}

// Copies src [planes, hs, ws] into dst planes of hd x wd (dst_plane apart) at row pad_h, column
// pad_w; a negative pad crops. The rest of dst is left as it is: its zeros are written once per
// call (every image pads the same places).
template <typename T>
void copy_padded(const T* src, int64_t planes, int64_t hs, int64_t ws, int64_t pad_h, int64_t pad_w,
                 T* dst, int64_t hd, int64_t wd, int64_t dst_plane) {
  const int64_t lo = std::clamp<int64_t>(pad_w, 0, wd);
  const int64_t hi = std::clamp<int64_t>(ws + pad_w, lo, wd);
  const int64_t r_lo = std::clamp<int64_t>(pad_h, 0, hd);
  const int64_t r_hi = std::clamp<int64_t>(hs + pad_h, r_lo, hd);
  for (int64_t s = 0; s < planes; ++s)
    for (int64_t r = r_lo; r < r_hi; ++r)
      copy_row(dst + s * dst_plane + r * wd + lo, src + (s * hs + r - pad_h) * ws + (lo - pad_w),
               hi - lo);
}

// The layout of one image's padded copy and wide result for a stride-1 convolution of a
// [planes, hs, ws] source with a kh x kw kernel (dilation dh, dw) and pads (signed).
struct ShiftedLayout {
  int64_t pad_h, pad_w;
  int64_t hp, wp;      // padded plane
  int64_t rows, cols;  // result (cols valid columns of each wide row)
  int64_t width;       // wide result length per row of A: rows * wp, rounded up to the tile
  int64_t planes;      // padded copy: planes * hp * wp values, then tail zeros
  int64_t tail;

  ShiftedLayout(int64_t num_planes, int64_t hs, int64_t ws, int64_t ph, int64_t pw, int64_t kh,
                int64_t kw, int64_t dh, int64_t dw, int64_t tile)
      : pad_h(ph),
        pad_w(pw),
        hp(hs + 2 * ph),
        wp(ws + 2 * pw),
        rows(hp - (kh - 1) * dh),
        cols(wp - (kw - 1) * dw),
        width((rows * wp + tile - 1) / tile * tile),
        planes(num_planes),
        // The last tap of the last plane reads (kw-1) dw + width - rows wp past the planes.
        tail((kw - 1) * dw + width - rows * wp) {}
  int64_t plane() const { return hp * wp; }
  int64_t padded_size() const { return planes * plane() + tail; }
};

// off[(s kh + i) kw + j] = s plane + i dh wp + j dw.
inline void tap_offsets(int64_t sources, int64_t kh, int64_t kw, int64_t dh, int64_t dw,
                        const ShiftedLayout& l, int64_t* off) {
  for (int64_t s = 0; s < sources; ++s)
    for (int64_t i = 0; i < kh; ++i)
      for (int64_t j = 0; j < kw; ++j)
        off[(s * kh + i) * kw + j] = s * l.plane() + i * dh * l.wp + j * dw;
}

}  // namespace encore::kernels::cpu::shifted
