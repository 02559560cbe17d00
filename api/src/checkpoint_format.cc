#include "api/src/checkpoint_format.h"

#include <charconv>

namespace encore::checkpoint {

std::string_view dtype_code(DType dtype) {
  switch (dtype) {
    case DType::Float32:
      return "F32";
    case DType::Float64:
      return "F64";
    case DType::Int32:
      return "I32";
    case DType::Int64:
      return "I64";
    case DType::Bool:
      return "BOOL";
  }
  fail("checkpoint: dtype ", static_cast<int>(dtype), " has no safetensors code");
}

std::optional<DType> dtype_from_code(std::string_view code) {
  for (DType d : {DType::Float32, DType::Float64, DType::Int32, DType::Int64, DType::Bool})
    if (dtype_code(d) == code) return d;
  return std::nullopt;
}

std::vector<Target> targets(const nn::Module& module, optim::Optimizer* optimizer) {
  std::vector<Target> out;
  auto add_module_slots = [&](const std::vector<std::pair<std::string, Tensor*>>& slots) {
    for (const auto& [name, t] : slots)
      if (t->defined()) out.push_back({name, t, t->shape(), t->dtype(), t->device()});
  };
  add_module_slots(module.named_parameter_slots());
  add_module_slots(module.named_buffer_slots());
  if (optimizer)
    for (const optim::StateSlot& s : optimizer->state_slots())
      out.push_back({std::string(kOptimizerPrefix) + s.name, s.tensor, s.shape, s.dtype, s.device});
  return out;
}

std::string format_double(double value) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, value);
  return std::string(buf, r.ptr);
}

namespace {
template <typename T>
std::optional<T> parse_whole(std::string_view text) {
  T value{};
  const auto r = std::from_chars(text.data(), text.data() + text.size(), value);
  if (r.ec != std::errc() || r.ptr != text.data() + text.size()) return std::nullopt;
  return value;
}
}  // namespace

std::optional<double> parse_double(std::string_view text) {
  return parse_whole<double>(text);
}
std::optional<uint64_t> parse_uint(std::string_view text) {
  return parse_whole<uint64_t>(text);
}
std::optional<int64_t> parse_int(std::string_view text) {
  return parse_whole<int64_t>(text);
}

}  // namespace encore::checkpoint
