// The program of a StridedCopy step. The planner (schedule/layout_folds.cc) turns a chain of
// layout steps (permute, slice, split, concat, copy) whose intermediate values only the chain
// reads into one copy from the chain's first inputs to its last output: a permute of one part of
// a split reads its elements where the split read them, a concat of permutes writes each part's
// elements where the permute would have put them. Elements are moved, never looked at, so the
// step writes exactly what the chain wrote.
//
// The outputs are written piece by piece: piece p copies dims[0] x ... x dims[rank-1] elements
// of input `input`, element (i_0, ...) read at in_offset + sum(i_d * in_strides[d]) and written at
// out_offset + sum(i_d * out_strides[d]) of output `output` (offsets and strides in elements).
// The pieces cover the outputs, each element once. A step of several outputs is several chains
// from one buffer side by side (attention's q, k and v from the projection), one launch on CUDA.
// Size-1 dimensions are dropped and dimensions walked contiguously in both buffers merged when the
// plan makes the piece, so a piece has as few dimensions as it can and a kernel walks them as they
// are.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/shape.h"

namespace encore {

struct StridedPiece {
  static constexpr int kMaxRank = Shape::kMaxRank;
  int input = 0;
  int output = 0;
  int rank = 1;
  int64_t in_offset = 0, out_offset = 0;
  int64_t dims[kMaxRank] = {1};
  int64_t in_strides[kMaxRank] = {}, out_strides[kMaxRank] = {};

  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= dims[d];
    return n;
  }
  // Whether the output is walked contiguously from out_offset (a gather).
  bool contiguous_output() const {
    int64_t s = 1;
    for (int d = rank - 1; d >= 0; --d) {
      if (dims[d] != 1 && out_strides[d] != s) return false;
      s *= dims[d];
    }
    return true;
  }
};

struct StridedCopyProgram {
  std::vector<StridedPiece> pieces;
  // Per output of the step, the recorded step it stands for and which of that step's outputs
  // (verify mode compares it with that output's eager bytes): one part of a split; -1: the
  // recorded step's only output.
  struct Recorded {
    int step = -1;
    int output = -1;
  };
  std::vector<Recorded> recorded;
};

}  // namespace encore
