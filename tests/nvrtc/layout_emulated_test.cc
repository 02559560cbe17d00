// The layout kernels (kernels/cuda/layout.cuh) run on the host (emulated_kernel.h: each CUDA
// thread a fiber, blocks one after another, shared memory and __syncthreads) on layout.cu's launch
// plans, against copies made here element by element: permutes through each of gather's plans (a
// plain copy, tiles of a batched transpose over partial tiles, the general gather; on their grids
// and on one block, whose loops come round), and strided
// copies whose pieces write at strides (a concat of transposed parts, eight to a launch) beside
// pieces that are gathers (attention's head split). The [cuda] tests check the device's bits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "kernels/strided_loop.h"
#include "runtime/kernel_abi.h"
#include "runtime/strided_copy.h"
#include "tests/nvrtc/emulated_kernel.h"

using namespace encore;

namespace {

constexpr const char* kSource = R"cuda(
#include <cstring>
#include "kernels/cuda/layout.cuh"
using namespace encore;
using namespace encore::kernels;
using namespace encore::kernels::cuda;
// layout.cu's gather of 4-byte elements, or on one block (its grid-stride loops come round);
// returns the plan's kind.
int gather_u32(unsigned* out, const unsigned* in, const StridedLoop<2>& loop, long long n,
               bool one_block = false) {
  GatherPlan plan = plan_gather(loop);
  if (one_block) plan.grid[0] = plan.grid[1] = plan.grid[2] = 1;
  switch (plan.kind) {
    case GatherPlan::kCopy:
      std::memcpy(out, in, n * sizeof(unsigned));
      break;
    case GatherPlan::kTiles:
      emulate_launch(EmulatedDim3{plan.grid[0], plan.grid[1], plan.grid[2]},
                     EmulatedDim3{kTile, kTileRows, 1}, [&] {
        transpose_kernel<unsigned>(plan.batches, plan.batch, plan.rows, plan.cols, plan.in_stride,
                                   out, in);
      });
      break;
    case GatherPlan::kGeneral:
      emulate_launch(one_block ? 1 : blocks_for(n), kThreads,
                     [&] { gather_kernel<unsigned>(n, plan.g, out, in); });
  }
  return plan.kind;
}
extern "C" int permute_u32(unsigned* out, const unsigned* in, const StridedLoop<2>* loop,
                           long long n, bool one_block) {
  return gather_u32(out, in, *loop, n, one_block);
}
// layout.cu's strided_copy of 4-byte elements; returns the launches of pieces at strides, and
// the largest element count each was given.
extern "C" int strided_copy_u32(const StridedPiece* pieces, int count, const BufferView* in,
                                int inputs, const BufferView* out, int outputs,
                                long long* largest) {
  int launches = 0;
  for_each_copy_launch(
      std::span<const StridedPiece>(pieces, count), std::span<const BufferView>(in, inputs),
      std::span<const BufferView>(out, outputs),
      [&](const StridedPiece& p, const BufferView& input, const BufferView& output) {
        gather_u32(static_cast<unsigned*>(output.data) + p.out_offset,
                   static_cast<const unsigned*>(input.data) + p.in_offset, piece_loop(p),
                   p.numel());
      },
      [&](const CopyPieces& batch, long long n, long long most) {
        largest[launches++] = most;
        emulate_launch(blocks_for(n), kThreads,
                       [&] { pieces_kernel<unsigned, unsigned>(n, batch); });
      });
  return launches;
}
)cuda";

using Permute = int (*)(unsigned*, const unsigned*, const kernels::StridedLoop<2>*, long long,
                        bool);
using Copy = int (*)(const StridedPiece*, int, const BufferView*, int, const BufferView*, int,
                     long long*);

const testing::HostObject& layout_kernels() {
  static const testing::HostObject object({}, kSource);
  return object;
}

// Elements 0, 1, 2, ... (each distinct, so a misplaced one shows).
std::vector<unsigned> iota(int64_t n, unsigned from = 0) {
  std::vector<unsigned> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

// Row-major strides of a shape.
std::vector<int64_t> strides_of(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * shape[d + 1];
  return s;
}

// The piece's copy, element by element.
void copy_piece(const StridedPiece& p, const std::vector<unsigned>& in,
                std::vector<unsigned>& out) {
  std::vector<int64_t> idx(p.rank, 0);
  for (int64_t e = 0; e < p.numel(); ++e) {
    int64_t from = p.in_offset, to = p.out_offset;
    for (int d = 0; d < p.rank; ++d)
      from += idx[d] * p.in_strides[d], to += idx[d] * p.out_strides[d];
    out[to] = in[from];
    for (int d = p.rank - 1; d >= 0 && ++idx[d] == p.dims[d]; --d) idx[d] = 0;
  }
}

}  // namespace

TEST_CASE("permutes run through each of gather's plans (emulated)", "[nvrtc][emulated]") {
  const auto permute = layout_kernels().function<Permute>("permute_u32");
  struct Case {
    std::vector<int64_t> shape;
    std::vector<int> perm;
    int plan;  // GatherPlan::Kind: copy 0, tiles 1, general 2
  };
  const Case cases[] = {
      {{6, 5, 7}, {0, 1, 2}, 0},           // no permute: one contiguous run
      {{9, 70}, {1, 0}, 1},                // a transpose, partial tiles both ways
      {{3, 40, 50}, {0, 2, 1}, 1},         // batched
      {{2, 3, 33, 8}, {1, 0, 3, 2}, 1},    // batches walked at strides
      {{16, 4, 64, 32}, {0, 2, 1, 3}, 2},  // attention's heads back together: rows stay rows
      {{5, 4, 3}, {2, 0, 1}, 2},           // dimensions too short to tile
  };
  for (const Case& c : cases) {
    const int rank = static_cast<int>(c.shape.size());
    std::vector<int64_t> out_shape(rank);
    for (int d = 0; d < rank; ++d) out_shape[d] = c.shape[c.perm[d]];
    INFO("shape rank " << rank << ", out " << out_shape[0] << "x" << out_shape[rank - 1]);
    // permute_kernel's loop: the output contiguous, the input at its permuted strides.
    const std::vector<int64_t> in_strides = strides_of(c.shape),
                               out_strides = strides_of(out_shape);
    int64_t strides[2][kernels::kMaxRank] = {};
    for (int d = 0; d < rank; ++d) {
      strides[0][d] = out_strides[d];
      strides[1][d] = in_strides[c.perm[d]];
    }
    const kernels::StridedLoop<2> loop =
        kernels::make_strided_loop<2>(rank, out_shape.data(), strides);
    const int64_t n =
        std::accumulate(c.shape.begin(), c.shape.end(), int64_t{1}, std::multiplies<>());
    const std::vector<unsigned> in = iota(n);
    std::vector<unsigned> out(n, ~0u), one_block(n, ~0u);
    CHECK(permute(out.data(), in.data(), &loop, n, false) == c.plan);
    permute(one_block.data(), in.data(), &loop, n, true);
    std::vector<unsigned> want(n);
    StridedPiece whole;
    whole.rank = rank;
    for (int d = 0; d < rank; ++d) {
      whole.dims[d] = out_shape[d];
      whole.in_strides[d] = in_strides[c.perm[d]];
      whole.out_strides[d] = out_strides[d];
    }
    copy_piece(whole, in, want);
    CHECK(out == want);
    CHECK(one_block == want);
  }
}

TEST_CASE("a strided copy's pieces run as gathers and in launches of eight (emulated)",
          "[nvrtc][emulated]") {
  const auto copy = layout_kernels().function<Copy>("strided_copy_u32");
  // `parts` inputs [B, H, T, D] permuted to [B, T, H, D] and concatenated along the last axis of
  // [B, T, parts * H * D] (attention's gradients of q, k and v): pieces at strides. Then one
  // more input [B, T, H * D] whose heads are split out into an output behind the concat (a
  // contiguous piece: a gather).
  const int64_t B = 2, H = 3, T = 9, D = 5;
  for (const int parts : {3, 8, 11}) {
    INFO(parts << " parts");
    const int64_t part = B * H * T * D, concat = parts * part;
    std::vector<std::vector<unsigned>> inputs;
    std::vector<StridedPiece> pieces;
    for (int k = 0; k < parts; ++k) {
      inputs.push_back(iota(part, static_cast<unsigned>(k * part)));
      StridedPiece p;
      p.input = k;
      p.rank = 4;
      const int64_t dims[4] = {B, T, H, D}, in_s[4] = {H * T * D, D, T * D, 1},
                    out_s[4] = {T * parts * H * D, parts * H * D, D, 1};
      for (int d = 0; d < 4; ++d)
        p.dims[d] = dims[d], p.in_strides[d] = in_s[d], p.out_strides[d] = out_s[d];
      p.out_offset = k * H * D;
      REQUIRE_FALSE(p.contiguous_output());
      pieces.push_back(p);
    }
    inputs.push_back(iota(B * T * H * D, 1u << 20));
    StridedPiece heads;  // [B, T, H*D] -> [B, H, T, D] at the end of the output
    heads.input = parts;
    heads.rank = 4;
    const int64_t dims[4] = {B, H, T, D}, in_s[4] = {T * H * D, D, H * D, 1},
                  out_s[4] = {H * T * D, T * D, D, 1};
    for (int d = 0; d < 4; ++d)
      heads.dims[d] = dims[d], heads.in_strides[d] = in_s[d], heads.out_strides[d] = out_s[d];
    heads.out_offset = concat;
    REQUIRE(heads.contiguous_output());
    pieces.insert(pieces.begin() + 1, heads);  // between pieces at strides

    std::vector<BufferView> views;
    for (std::vector<unsigned>& v : inputs)
      views.push_back({v.data(), Shape{static_cast<int64_t>(v.size())}, DType::Int32});
    const int64_t out_numel = concat + B * T * H * D;
    std::vector<unsigned> out(out_numel, ~0u), want(out_numel, ~0u);
    const BufferView out_view{out.data(), Shape{out_numel}, DType::Int32};
    long long largest[2] = {0, 0};
    CHECK(copy(pieces.data(), static_cast<int>(pieces.size()), views.data(),
               static_cast<int>(views.size()), &out_view, 1, largest) == (parts + 7) / 8);
    CHECK(largest[0] == out_numel);  // the index type's bound: the output, larger than any input
    if (parts > 8) CHECK(largest[1] == out_numel);
    for (const StridedPiece& p : pieces) copy_piece(p, inputs[p.input], want);
    CHECK(std::count(want.begin(), want.end(), ~0u) == 0);  // the pieces cover the output
    CHECK(out == want);
  }
}

TEST_CASE("a strided copy of several outputs runs its contiguous pieces in one launch (emulated)",
          "[nvrtc][emulated]") {
  const auto copy = layout_kernels().function<Copy>("strided_copy_u32");
  // Attention's head split: q, k and v [B, H, T, D] out of the projection [B, T, 3 H D], three
  // outputs each written contiguously by its piece: one launch, not a gather each.
  const int64_t B = 2, H = 3, T = 9, D = 5, part = B * H * T * D;
  std::vector<unsigned> projection = iota(3 * part);
  std::vector<StridedPiece> pieces;
  for (int k = 0; k < 3; ++k) {
    StridedPiece p;
    p.output = k;
    p.rank = 4;
    const int64_t dims[4] = {B, H, T, D}, in_s[4] = {T * 3 * H * D, D, 3 * H * D, 1},
                  out_s[4] = {H * T * D, T * D, D, 1};
    for (int d = 0; d < 4; ++d)
      p.dims[d] = dims[d], p.in_strides[d] = in_s[d], p.out_strides[d] = out_s[d];
    p.in_offset = k * H * D;
    REQUIRE(p.contiguous_output());
    pieces.push_back(p);
  }
  const BufferView in{projection.data(), Shape{3 * part}, DType::Int32};
  std::vector<std::vector<unsigned>> outs(3, std::vector<unsigned>(part, ~0u));
  std::vector<BufferView> views;
  for (std::vector<unsigned>& o : outs) views.push_back({o.data(), Shape{part}, DType::Int32});
  long long largest[1] = {0};
  CHECK(copy(pieces.data(), 3, &in, 1, views.data(), 3, largest) == 1);
  CHECK(largest[0] == 3 * part);  // the index type's bound: the input, larger than each output
  for (int k = 0; k < 3; ++k) {
    INFO("output " << k);
    std::vector<unsigned> want(part, ~0u);
    copy_piece(pieces[k], projection, want);
    CHECK(std::count(want.begin(), want.end(), ~0u) == 0);
    CHECK(outs[k] == want);
  }
}
