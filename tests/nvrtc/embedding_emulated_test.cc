// The embedding kernels (kernels/cuda/embedding.cuh) run on the host (emulated_kernel.h: each
// CUDA thread a fiber, blocks one after another, shared memory, __syncthreads and the warp
// ballots) on embedding.cu's grid, against the gradient summed here in id order, in the kernel's
// dtype, so the bits must be equal: both the one-row form (a ballot per warp gathers a row's ids)
// and the general one, over several id tiles, a partial last chunk and a partial column block, with
// a padding row. An id out of range gives a NaN row forward, is skipped by the gradient and is
// reported in the device's error slot. The [cuda] tests check the kernels on a device.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/cuda.h"
#include "runtime/ops.h"
#include "tests/nvrtc/emulated_kernel.h"

using namespace encore;

namespace {

constexpr const char* kSource = R"cuda(
#include "kernels/cuda/embedding.cuh"
using namespace encore::kernels::cuda;
using encore::cuda::DeviceErrorSlot;
// The launches of embedding.cu (the forward on fewer blocks, so that its loop comes round):
// y [n, dim] = w[ids]; gw [rows, dim] from gy [n, dim] (gw zeroed
// here where embedding.cu zeroes it).
extern "C" void embedding_f32(const long long* ids, const float* w, float* y, long long n,
                              long long rows, long long dim, DeviceErrorSlot errors) {
  const long long total = n * dim;
  const unsigned blocks = total / 256 + 1 < 64 ? total / 256 + 1 : 64;  // the loop comes round
  emulate_launch(blocks, 256, [&] { embedding_kernel<float, long long>(ids, w, y, n, rows, dim, errors); });
}
extern "C" bool embedding_grad_f32(const long long* ids, const float* gy, float* gw, long long n,
                                   long long rows, long long dim, long long pad,
                                   DeviceErrorSlot errors) {
  const EmbeddingGradGrid g = embedding_grad_grid(rows, dim);
  const EmulatedDim3 grid{g.columns, g.ranges, 1}, block{kGradThreads, 1, 1};
  if (n > 0 && g.one_row) {
    emulate_launch(grid, block, [&] {
      embedding_grad_row_kernel<float, long long>(ids, gy, gw, n, rows, dim, pad, errors);
    });
    return true;
  }
  for (long long k = 0; k < rows * dim; ++k) gw[k] = 0;
  if (n > 0)
    emulate_launch(grid, block, [&] {
      embedding_grad_kernel<float, long long>(ids, gy, gw, n, rows, dim, pad, errors);
    });
  return false;
}
)cuda";

using Forward = void (*)(const long long*, const float*, float*, long long, long long, long long,
                         cuda::DeviceErrorSlot);
using Backward = bool (*)(const long long*, const float*, float*, long long, long long, long long,
                          long long, cuda::DeviceErrorSlot);

const testing::HostObject& embedding_kernels() {
  static const testing::HostObject object({}, kSource);
  return object;
}

std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// gw [rows, dim] summed in id order in float, as the kernels sum (the padding row and ids out of
// range left out).
std::vector<float> reference_grad(const std::vector<long long>& ids, const std::vector<float>& gy,
                                  int64_t rows, int64_t dim, int64_t pad) {
  std::vector<float> gw(rows * dim, 0.0f);
  for (size_t i = 0; i < ids.size(); ++i) {
    const long long v = ids[i];
    if (v < 0 || v >= rows || v == pad) continue;
    for (int64_t d = 0; d < dim; ++d) gw[v * dim + d] += gy[i * dim + d];
  }
  return gw;
}

}  // namespace

TEST_CASE("the embedding gradient kernels sum each row's ids in order, bit for bit (emulated)",
          "[nvrtc][emulated]") {
  const auto backward = embedding_kernels().function<Backward>("embedding_grad_f32");
  struct Case {
    int64_t rows, dim, n, pad;
    bool one_row;
  };
  // Ids over two and a half tiles of 1,024 with a partial last chunk of 128; columns over one
  // and two blocks of 128 (the second partial); a language model's vocabulary (one row per
  // block) and a table past 1,024 rows (the general kernel, several rows per range).
  const Case cases[] = {{96, 200, 2500, 3, true},   {7, 128, 70, -1, true},
                        {1, 33, 1030, -1, true},    {1030, 3, 2100, 1029, false},
                        {2051, 130, 300, 5, false}, {12, 5, 0, -1, true}};
  std::mt19937 rng(7);
  for (const Case& c : cases) {
    INFO("rows " << c.rows << ", dim " << c.dim << ", " << c.n << " ids, padding " << c.pad);
    std::uniform_int_distribution<long long> pick(0, c.rows - 1);
    std::vector<long long> ids(c.n);
    for (long long& v : ids) v = pick(rng);
    if (c.n > 10) ids[9] = ids[3];  // a row taken twice
    const std::vector<float> gy = random_floats(c.n * c.dim, rng);
    std::vector<float> gw(c.rows * c.dim, NAN);  // the one-row kernel writes every element
    testing::HostErrorSlot errors;
    const bool one_row =
        backward(ids.data(), gy.data(), gw.data(), c.n, c.rows, c.dim, c.pad, errors.slot());
    CHECK(one_row == (c.one_row && c.n > 0));
    const std::vector<float> want = reference_grad(ids, gy, c.rows, c.dim, c.pad);
    int64_t wrong = 0;
    for (size_t k = 0; k < want.size(); ++k) wrong += std::memcmp(&gw[k], &want[k], 4) != 0;
    CHECK(wrong == 0);
    CHECK(errors.claim == 0);
  }
}

TEST_CASE("an embedding id out of range is reported, NaN forward and skipped backward (emulated)",
          "[nvrtc][emulated]") {
  const auto forward = embedding_kernels().function<Forward>("embedding_f32");
  const auto backward = embedding_kernels().function<Backward>("embedding_grad_f32");
  std::mt19937 rng(11);
  for (const int64_t rows : {int64_t{10}, int64_t{1100}}) {
    INFO(rows << " rows");
    const int64_t dim = 6, n = 40;
    std::vector<long long> ids(n);
    for (int64_t i = 0; i < n; ++i) ids[i] = (i * 7) % rows;
    ids[17] = rows;  // one past the end
    const std::vector<float> w = random_floats(rows * dim, rng), gy = random_floats(n * dim, rng);

    std::vector<float> y(n * dim);
    testing::HostErrorSlot f;
    forward(ids.data(), w.data(), y.data(), n, rows, dim, f.slot());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t d = 0; d < dim; ++d) {
        if (i == 17)
          CHECK(std::isnan(y[i * dim + d]));
        else
          CHECK(y[i * dim + d] == w[ids[i] * dim + d]);
      }
    CHECK(f.claim == 1);
    CHECK(f.kind() == static_cast<long long>(cuda::DeviceErrorKind::Id));
    CHECK(f.op() == static_cast<long long>(Op::Embedding));
    CHECK(f.record[1] == rows);  // the id, its index, the bound
    CHECK(f.record[2] == 17);
    CHECK(f.record[3] == rows);

    std::vector<float> gw(rows * dim, NAN);
    testing::HostErrorSlot b;
    backward(ids.data(), gy.data(), gw.data(), n, rows, dim, -1, b.slot());
    CHECK(gw == reference_grad(ids, gy, rows, dim, -1));
    CHECK(b.claim == 1);
    CHECK(b.op() == static_cast<long long>(Op::EmbeddingGrad));
    CHECK(b.record[1] == rows);
    CHECK(b.record[2] == 17);
  }
}
