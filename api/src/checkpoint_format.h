// What the checkpoint reader and writer share: the safetensors dtype codes, the names of the
// tensors a module and an optimizer save, and how numbers are written in the metadata.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "encore/nn.h"
#include "encore/optim.h"

namespace encore::checkpoint {

inline constexpr std::string_view kFormat = "encore.checkpoint";
inline constexpr std::string_view kFormatVersion = "1";
inline constexpr std::string_view kOptimizerPrefix = "optimizer.";

// "F32", "F64", "I32", "I64", "BOOL".
std::string_view dtype_code(DType dtype);
std::optional<DType> dtype_from_code(std::string_view code);

// A tensor a checkpoint holds: a module's parameter or buffer, or an optimizer's state.
struct Target {
  std::string name;  // "c1.weight", "optimizer.0.m"
  Tensor* tensor;    // undefined: optimizer state not created yet (the loader creates it)
  Shape shape;
  DType dtype;
  Device device;
};
// The module's parameters and buffers, then the optimizer's state (when given), in file order.
std::vector<Target> targets(const nn::Module& module, optim::Optimizer* optimizer);

// Metadata numbers as strings that read back to the same value.
std::string format_double(double value);
std::optional<double> parse_double(std::string_view text);
std::optional<uint64_t> parse_uint(std::string_view text);
std::optional<int64_t> parse_int(std::string_view text);

}  // namespace encore::checkpoint
