// Device: where a tensor's storage lives. CPU today; CUDA is a later backend.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace encore {

enum class DeviceType : uint8_t { CPU, CUDA };
inline constexpr int kNumDeviceTypes = 2;

struct Device {
  DeviceType type = DeviceType::CPU;
  int8_t index = 0;

  static constexpr Device cpu() { return {DeviceType::CPU, 0}; }
  static constexpr Device cuda(int i = 0) { return {DeviceType::CUDA, static_cast<int8_t>(i)}; }
  // Parses "cpu", "cuda", "cuda:1".
  static Device parse(std::string_view s);

  bool operator==(const Device&) const = default;
  std::string str() const;
};

}  // namespace encore
