// Seeded random numbers owned by the runtime, one generator per device.
//
//   encore::manual_seed(42);              // all devices
//   auto [seed, offset] = default_generator(Device::cpu()).reserve(n);  // n numbers
//
// Draws are counter-based (Philox4x32-10): a call reserves `n` numbers at (seed, offset) and
// advances the offset, so the numbers of a call depend only on the seed and how many numbers
// were drawn before it, on every device.
#pragma once

#include <cstdint>
#include <mutex>

#include "runtime/device.h"
#include "runtime/host_device.h"

namespace encore {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  void manual_seed(uint64_t seed) {
    std::lock_guard<std::mutex> l(mu_);
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t seed() {
    std::lock_guard<std::mutex> l(mu_);
    return seed_;
  }
  uint64_t offset() {
    std::lock_guard<std::mutex> l(mu_);
    return offset_;
  }
  struct Stream {
    uint64_t seed;
    uint64_t offset;
    bool operator==(const Stream&) const = default;
  };
  // The seed and the offset of the next number, read together.
  Stream state() {
    std::lock_guard<std::mutex> l(mu_);
    return {seed_, offset_};
  }
  // Restores a state read with state() (or seed() and offset()).
  void set_state(Stream s) { set_state(s.seed, s.offset); }
  void set_state(uint64_t seed, uint64_t offset) {
    std::lock_guard<std::mutex> l(mu_);
    seed_ = seed;
    offset_ = offset;
  }
  // Reserves `n` numbers (rounded up to blocks of 4): the seed and the offset of the first.
  Stream reserve(uint64_t n) {
    std::lock_guard<std::mutex> l(mu_);
    const Stream s{seed_, offset_};
    offset_ += (n + 3) / 4 * 4;
    return s;
  }

 private:
  std::mutex mu_;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// How many numbers a random op (UniformInit, NormalInit, dropout masks) reserves for a tensor of
// `numel` elements; a static replay reserves the same again.
inline uint64_t random_count(int64_t numel) {
  return 4 * static_cast<uint64_t>(numel);
}

Generator& default_generator(Device d);
// Seeds every device's generator.
void manual_seed(uint64_t seed);

// Philox4x32-10: four 32-bit random words for (seed, counter).
struct Philox4 {
  uint32_t v[4];
};
ENCORE_HOST_DEVICE inline Philox4 philox(uint64_t seed, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = uint64_t{0xD2511F53} * c0, p1 = uint64_t{0xCD9E8D57} * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

}  // namespace encore
