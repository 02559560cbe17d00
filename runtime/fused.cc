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

std::vector<std::string> prepare_fused(std::span<FusedProgram* const> programs, Device device) {
  if (device.type == DeviceType::CPU || programs.empty())
    return std::vector<std::string>(programs.size());
  const FusedPrepare prepare = preparers()[static_cast<size_t>(device.type)];
  if (prepare == nullptr)
    return std::vector<std::string>(programs.size(), "no fused kernels for " + device.str());
  return prepare(programs, device);
}

}  // namespace encore
