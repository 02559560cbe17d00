// The backends' preparation of fused programs (runtime/fused.h).
#include "runtime/fused.h"

#include <array>

namespace encore {
namespace {

// Written at static-initialisation time only, read by planners afterwards.
std::array<FusedPrepare, kNumDeviceTypes>& preparers() {
  static std::array<FusedPrepare, kNumDeviceTypes> table{};
  return table;
}

}  // namespace

void register_fused_prepare(DeviceType type, FusedPrepare prepare) {
  preparers()[static_cast<size_t>(type)] = prepare;
}

std::string prepare_fused(FusedProgram& program, Device device) {
  if (device.type == DeviceType::CPU) return {};
  const FusedPrepare prepare = preparers()[static_cast<size_t>(device.type)];
  if (prepare == nullptr) return "no fused kernels for " + device.str();
  return prepare(program, device);
}

}  // namespace encore
