#include "runtime/rng.h"

namespace encore {
namespace {
constexpr uint64_t kDefaultSeed = 0x5eed;
Generator* generators() {
  static Generator* g =
      new Generator[kNumDeviceTypes]{Generator(kDefaultSeed), Generator(kDefaultSeed)};
  return g;
}
}  // namespace

Generator& default_generator(Device d) {
  return generators()[static_cast<int>(d.type)];
}

void manual_seed(uint64_t seed) {
  for (int i = 0; i < kNumDeviceTypes; ++i) generators()[i].manual_seed(seed);
}

}  // namespace encore
