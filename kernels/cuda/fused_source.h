// The CUDA C++ source of a fused program (runtime/fused.h): one kernel, `encore_fused`, in which
// each thread runs the whole program for its elements (a program with row ops: each warp for its
// rows, each lane for its elements of the row), every value in registers, with the element and
// row functions of the unfused kernels (element_ops.cuh). Host code: it needs neither a GPU nor
// the CUDA compiler, and NVRTC compiles what it writes (nvrtc.h).
//
// The kernel's parameters: the element count, or the row count for a program with row ops
// (unsigned long long), the program's inputs in order (const T*, or const unsigned char* for a
// bool condition), then its outputs (T*). An input is read at the element's index (Full), at 0
// (One), at index % row (Row), index / row (Column) or index % tile (Tile); an output is written
// at the element's index (or row's, for a value per row), once every input of the element (or
// row) has been read, so an output may share its buffer with an input of the run's element count
// (in place).
#pragma once

#include <string>
#include <string_view>

#include "runtime/fused.h"

namespace encore::kernels::cuda {

inline constexpr const char* kFusedKernelName = "encore_fused";
// Threads per block of a fused kernel (its __launch_bounds__), and rows per block of one with row
// ops (a warp each): fused.cc launches it so.
inline constexpr int kFusedThreads = 256;
inline constexpr int kFusedRowsPerBlock = kFusedThreads / 32;
// The name under which the generated source includes element_ops.cuh.
inline constexpr const char* kElementOpsInclude = "encore_element_ops.cuh";

// "" when the program can run as one CUDA kernel, else why not: a float32 or float64 program of
// elementwise instructions (kFusable ops, one output each) and row ops fused_row_op allows on
// CUDA (rows of up to kMaxCudaRow), reading registers written before (a bool input only as
// where's condition).
std::string fused_unsupported(const FusedProgram& p);

// What every source of fused kernels starts with: element_ops.cuh, and its namespace in scope.
std::string fused_prelude();

// One program's kernel, named `name` (extern "C"), to follow the prelude; several kernels may
// follow one prelude (a plan's programs compile together). The program must be supported (else
// Error).
std::string fused_kernel_source(const FusedProgram& p, std::string_view name);

// A whole source: the prelude and the program's kernel, named kFusedKernelName.
std::string fused_source(const FusedProgram& p);

// The text of element_ops.cuh, embedded at build time.
const char* element_ops_text();

}  // namespace encore::kernels::cuda
