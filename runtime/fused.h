// The program of a FusedElementwise step. The planner turns a run of adjacent elementwise
// steps of a cpu plan into one step whose kernel (kernels/cpu/fused.cc) runs the steps'
// operations block by block: intermediates only the run reads live in a scratch block, never
// in the arena, and every operand is read and written once per block instead of once per
// step. Each instruction computes exactly what its op's kernel computes (the same element
// functions), so a fused step gives the bits of the steps it stands for, except which NaN an
// operation on two NaNs returns (it follows the operand order the compiler chose).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/op_traits.h"

namespace encore {

// out = op(a) or op(a, b), elementwise; `scalar` is the ScalarAttrs value of scalar ops (and
// the slope of leaky_relu_grad, the form of gelu_grad).
struct FusedInstr {
  Op op = Op::Add;
  uint8_t out = 0, a = 0, b = 0;  // registers
  double scalar = 0;
};

// Registers: the step's inputs [0, n_in), then kMaxScratch scratch blocks (n_scratch of them
// used), then its outputs. An input with one element (bit set in `broadcast`) is read as a scalar
// by a binary op; every other operand has `numel` elements.
struct FusedProgram {
  static constexpr int kMaxInputs = 64;
  static constexpr int kMaxScratch = 8;
  static constexpr int kMaxSteps = 128;
  static constexpr int kMaxRegisters = kMaxInputs + kMaxSteps + kMaxScratch;

  std::vector<FusedInstr> instrs;
  int n_in = 0, n_out = 0, n_scratch = 0;
  uint64_t broadcast = 0;
  int64_t numel = 0;
  DType dtype = DType::Float32;
  std::vector<int> trace_index;  // per instruction: the recorded step it stands for
  std::vector<int> out_instr;    // per output: the instruction writing it

  int scratch_reg(int k) const { return n_in + k; }
  int out_reg(int k) const { return n_in + kMaxScratch + k; }
};

}  // namespace encore
