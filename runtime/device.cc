#include "runtime/device.h"

#include <charconv>

#include "runtime/error.h"

namespace encore {

Device Device::parse(std::string_view s) {
  if (s == "cpu") return cpu();
  if (s == "cuda") return cuda(0);
  int index = 0;
  if (s.substr(0, 5) == "cuda:") {
    const auto rest = s.substr(5);
    const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), index);
    if (ec == std::errc() && end == rest.data() + rest.size() && index >= 0 && index < 128)
      return cuda(index);
  }
  fail("Device: cannot parse '", s, "' (expected cpu, cuda or cuda:N)");
}

std::string Device::str() const {
  return type == DeviceType::CPU ? std::string("cpu") : "cuda:" + std::to_string(index);
}

}  // namespace encore
