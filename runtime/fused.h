// The program of a FusedElementwise step. The planner turns a run of adjacent elementwise
// steps of a cpu plan into one step whose kernel (kernels/cpu/fused.cc) runs the steps'
// operations block by block: intermediates only the run reads live in a scratch block, never
// in the arena, and every operand is read and written once per block instead of once per
// step. Each instruction computes exactly what its op's kernel computes (the same element
// functions), so a fused step gives the bits of the steps it stands for, except which NaN an
// operation on two NaNs returns (it follows the operand order the compiler chose).
//
// A run is over a tensor seen as [rows, row] (row: its last axis). Besides operands of the run's
// element count and one-element ones, a binary op (and where) may read an operand broadcast along
// the rows ([row]: element i reads i % row), along the row ([rows, 1]: element i reads i / row),
// or over the leading axes (a tile: [T, S] read by [B, H, T, S], element i reads i % (T * S)).
// where's condition is a bool input (its register holds a pointer to bytes). A row
// op (kRowFusable: a reduction over the last axis, softmax ...) works on whole rows of a block
// with the row function of its own kernel (kernels/cpu/fused_rows.h); a reduction writes one
// value per row, a column value later operations read broadcast along the row. layer_norm reads
// its gain and bias as one row each and writes y, and its mean and rstd as one value per row.
//
// On CUDA a run holds elementwise steps, where, and the row ops fused_row_op says (those whose
// unfused kernels run a warp per row at the row's length): the plan hands its program to the
// backend's prepare function (register_fused_prepare), which compiles it into one kernel with NVRTC
// (kernels/cuda/fused.cc) and stores the kernel in the program, so that a replay launches it with
// no lookup.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/op_traits.h"

namespace encore {

// How a register is indexed by the run's element i.
enum class FusedLayout : uint8_t {
  Full,    // i: the run's element count
  One,     // 0: one element
  Row,     // i % row: one row, broadcast over the rows
  Column,  // i / row: one value per row (a reduction's output, or an input [rows, 1])
  Tile,    // i % tile: an input broadcast over leading axes, its element count a multiple of row
};
inline constexpr int kFusedLayouts = 5;

// out = op(a) or op(a, b) (elementwise, or per row for a row op), or where(a, b, c): a the
// bool condition; `scalar` is the ScalarAttrs
// value of scalar ops (and the slope of leaky_relu_grad, the form of gelu_grad). la and lb say
// how a and b are read; the output is Full, or Column for a reduction. A row op may read a third
// operand c and write up to kMaxOutputs registers: layer_norm reads x (a), gamma (b) and beta (c)
// (each there when `flags`, its LayerNormAttrs::affine, says so; gamma and beta Row) and writes
// y (out[0], Full), mean and rstd (out[1], out[2], Column); its scalar is eps.
struct FusedInstr {
  static constexpr int kMaxOutputs = kMaxRowOpOutputs;
  Op op = Op::Add;
  uint8_t a = 0, b = 0, c = 0;  // registers read
  FusedLayout la = FusedLayout::Full, lb = FusedLayout::Full, lc = FusedLayout::Full;
  uint8_t n_out = 1;
  std::array<uint8_t, kMaxOutputs> out{};  // registers written, n_out of them
  uint8_t flags = 0;
  double scalar = 0;
};

// A fused step's output: instruction `instr` writes it as its output `output` (0 but for an
// op with several outputs).
struct FusedOutputOf {
  int instr = 0;
  int output = 0;
};

// Registers: the step's inputs [0, n_in) (each with its layout), then kMaxScratch scratch
// blocks (n_scratch of them used), then its outputs. A program writes at most kMaxSteps values
// (registers fit a byte).
struct FusedProgram {
  static constexpr int kMaxInputs = 64;
  static constexpr int kMaxScratch = 8;
  static constexpr int kMaxSteps = 128;
  static constexpr int kMaxRegisters = kMaxInputs + kMaxSteps + kMaxScratch;
  static constexpr int64_t kBlock = 256;    // elements per block (rows of a block, at least)
  static constexpr int64_t kMaxRow = 2048;  // the longest row a program with row ops takes

  std::vector<FusedInstr> instrs;
  int n_in = 0, n_out = 0, n_scratch = 0;
  std::vector<FusedLayout> in_layout;  // per input
  std::vector<int64_t> in_tile;        // per input (or empty): its element count if a Tile
  std::vector<bool> in_bool;     // per input (or empty): a bool condition (where's), else `dtype`
  std::vector<bool> out_column;  // per output: a column value (one per row)
  int64_t numel = 0;
  int64_t row = 1;       // the last axis of the run's shape
  bool by_rows = false;  // blocks hold whole rows (or pieces of one row): it reads Row, Column
                         // or Tile operands or has row ops
  bool row_ops = false;  // it has row ops: blocks hold whole rows, row <= kMaxRow (cpu) or a
                         // warp runs each row, row <= kMaxCudaRow (CUDA)
  DType dtype = DType::Float32;
  std::vector<int> trace_index;  // per instruction: the recorded step it stands for
  // Per output: the instruction writing it, and which of its outputs it is.
  std::vector<FusedOutputOf> out_instr;
  // The compiled kernel of a program for a device other than the cpu, set when the plan prepares
  // it (prepare_fused) and owned by the backend's cache for the life of the process.
  const void* device_kernel = nullptr;

  int64_t tile(int input) const {
    return static_cast<size_t>(input) < in_tile.size() ? in_tile[input] : 0;
  }
  bool reads_bool(int input) const {
    return static_cast<size_t>(input) < in_bool.size() && in_bool[input];
  }
  int scratch_reg(int k) const { return n_in + k; }
  int out_reg(int k) const { return n_in + kMaxScratch + k; }
  // Elements per scratch block.
  int64_t block() const { return row_ops && row > kBlock ? row : kBlock; }
};
static_assert(FusedProgram::kMaxRegisters <= 256, "a register is a byte");

// Whether a fused program on a device of `type` may hold row op `op` (kRowFusable) over rows of
// `row` elements: the cpu's fused kernel has every row op's row function (kernels/cpu/fused_rows.h)
// for rows up to kMaxRow; a CUDA one repeats what the unfused kernels do where they run a warp per
// row (kernels/cuda/element_ops.cuh): the softmax family and layer_norm up to kMaxCudaRow, sum,
// mean and max over the last axis up to kMaxCudaReduceRow (reduce.cuh's with_reduce_group takes a
// block past it).
// Other devices fuse none.
inline constexpr int64_t kMaxCudaRow = 1024;
// A row op that writes one value per row: sum, mean and max over the last axis.
constexpr bool row_reduction(Op op) {
  return op == Op::Sum || op == Op::Mean || op == Op::Max;
}
inline constexpr int64_t kMaxCudaReduceRow = 512;
constexpr bool fused_row_op(DeviceType type, Op op, int64_t row) {
  if (!op_row_fusable(op) || row < 2) return false;
  if (type == DeviceType::CPU) return row <= FusedProgram::kMaxRow;
  if (type != DeviceType::CUDA) return false;
  if (row_reduction(op)) return row <= kMaxCudaReduceRow;
  return row <= kMaxCudaRow;
}

// A backend's preparation of a plan's programs for a device of its type: compiles them (together,
// or finds them compiled) and sets each one's `device_kernel`. Returns per program "" when it is
// ready, else why it cannot run there; the plan then keeps that run's steps unfused.
using FusedPrepare = std::vector<std::string> (*)(std::span<FusedProgram* const> programs,
                                                  Device device);
// Registered by a backend at static-initialisation time.
void register_fused_prepare(DeviceType type, FusedPrepare prepare);
// Prepares `programs` for `device`: per program "" when ready (the cpu needs nothing), else why
// not (no backend registered one for the device type, or its reason).
std::vector<std::string> prepare_fused(std::span<FusedProgram* const> programs, Device device);

}  // namespace encore
