// A randomized differential test of static_graph. A generator builds a random program from the
// op set of functions.h (broadcasting binary ops, scalar forms, unary ops, matmul over broadcast
// batch dimensions and linear, reductions, layout ops, softmax and losses, layer_norm,
// masked_fill, conv2d with stride, padding, dilation, groups and
// an optional bias, max_pool2d, avg_pool2d with and without count_include_pad,
// global_avg_pool2d, batch_norm in training and eval mode, dropout in training (and eval) mode)
// as a list of steps, a deterministic function of its seed; a lambda interprets the list. Its
// arguments are float32 or float64 tensors (some requiring grad; some programs start from 4-D
// NCHW images) and perhaps int labels; some programs also capture "parameters" (linear and
// conv weights, biases, batch-norm gamma and beta) and batch-norm running statistics made
// outside the lambda. Each program is wrapped in static_graph, traced on inputs A (forward and
// backward), then replayed on inputs B and C (parameters and running statistics perhaps
// overwritten in place, parameter gradients kept, cleared or zeroed in between), and, when it
// has a dropout, replayed once more on C's inputs (D). Every call is compared with the same
// program run eagerly on the same inputs: outputs and every argument and parameter gradient bit
// for bit, the running statistics after every call (batch_norm updates them in place), the
// device generator's state (each eager reference call starts from the state the static call started
// from, and both must end in the same state: a replay reserves as many numbers as eager, and
// a dropout draws on every call), requires_grad and storage sharing of outputs with leaves,
// earlier outputs and gradients unchanged by later calls, outputs of a dropout differing
// between C and D (fresh masks), and one trace with replays in stats().
//
// The programs (random_program.h), their generator (random_program_gen.h) and the checks
// (random_program_check.h) are shared with the CUDA tests, which run them on cuda:0.
//
// A failure prints the program's seed and listing. To run that program alone:
//   ENCORE_RANDOM_SEED=<seed> ENCORE_RANDOM_PROGRAMS=1 encore_tests "[random]"
// ENCORE_RANDOM_SEED sets the first program's seed (program i has seed + i),
// ENCORE_RANDOM_PROGRAMS the number of programs; ENCORE_RANDOM_COVERAGE=1 prints how many
// programs had each op. A run of 2000 programs or more also checks that every op was made.
//
// The cpu plans fuse runs of elementwise steps (the default); a second run turns fusion off,
// so the unfused schedule (every elementwise op its own step, some in place) is tested as well.
#include <catch2/catch.hpp>
#include <cstdint>

#include "random_program_check.h"
#include "tests/test_util.h"

using namespace encore;

TEST_CASE("static_graph replays random programs bit for bit as eager runs them",
          "[static][random]") {
  const testing::StaticFusion fused(true);
  random_program::run_random_programs(Device::cpu(), /*default_programs=*/5000);
}

TEST_CASE("static_graph replays random programs bit for bit with fusion off", "[static][random]") {
  const testing::StaticFusion unfused(false);
  random_program::run_random_programs(Device::cpu(), /*default_programs=*/2000);
}
