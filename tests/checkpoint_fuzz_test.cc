// Fuzzing the checkpoint reader: thousands of seeded mutations of a valid file (truncations,
// byte flips in the header and the data, other header lengths, digits changed, bytes dropped).
// Every load succeeds or raises encore::Error, and a failed load changes nothing. The model is
// tiny so that the sanitizer build runs it too.
#include <catch2/catch.hpp>
#include <cstring>
#include <random>

#include "checkpoint_util.h"

using namespace encore;
using namespace encore::testing;

namespace {

std::vector<char> mutate(const std::vector<char>& good, uint64_t header_length,
                         std::mt19937_64& rng) {
  std::vector<char> b = good;
  auto pick = [&](uint64_t lo, uint64_t hi) {  // in [lo, hi)
    return std::uniform_int_distribution<uint64_t>(lo, hi - 1)(rng);
  };
  const uint64_t header_end = 8 + header_length;
  switch (pick(0, 7)) {
    case 0:  // truncated anywhere
      b.resize(pick(0, b.size()));
      break;
    case 1:  // bytes of the header flipped
      for (uint64_t n = pick(1, 4); n > 0; --n)
        b[pick(8, header_end)] ^= static_cast<char>(pick(1, 256));
      break;
    case 2:  // bytes of the data flipped (still a valid file: it loads other values)
      for (uint64_t n = pick(1, 4); n > 0; --n)
        b[pick(header_end, b.size())] ^= static_cast<char>(pick(1, 256));
      break;
    case 3: {  // another header length: near the true one, or anything
      uint64_t length = pick(0, 2) ? header_length + pick(0, 33) - 16 : rng();
      std::memcpy(b.data(), &length, 8);
      break;
    }
    case 4: {  // a digit of the header changed (shapes, offsets, metadata numbers)
      std::vector<uint64_t> digits;
      for (uint64_t i = 8; i < header_end; ++i)
        if (b[i] >= '0' && b[i] <= '9') digits.push_back(i);
      b[digits[pick(0, digits.size())]] = static_cast<char>('0' + pick(0, 10));
      break;
    }
    case 5: {  // a byte of the header dropped, the length kept
      b.erase(b.begin() + static_cast<int64_t>(pick(8, header_end)));
      break;
    }
    default:  // one byte anywhere set to a structural character
      b[pick(0, b.size())] = "{}[]\",:0-"[pick(0, 9)];
      break;
  }
  return b;
}

}  // namespace

TEST_CASE("checkpoint fuzz: a mutated file loads or raises Error, and a failure changes nothing",
          "[checkpoint][fuzz]") {
  TempPath dir("fuzz");
  const std::string good_path = dir.file("good.safetensors");
  const std::string path = dir.file("mutated.safetensors");
  manual_seed(1);
  auto model = nn::mlp(2, 3, 2);
  optim::Adam opt(model->parameters());
  Generator gen(9);
  save(good_path, *model, &opt, &gen);
  const std::vector<char> good = read_bytes(good_path);
  uint64_t header_length = 0;
  std::memcpy(&header_length, good.data(), 8);

  std::mt19937_64 rng(20261126);
  int loaded = 0, failed = 0;
  for (int i = 0; i < 10000; ++i) {
    write_bytes(path, mutate(good, header_length, rng));
    const Snapshot before(*model, &opt, &gen);
    bool ok = true;
    try {
      load(path, *model, &opt, &gen);
    } catch (const Error& e) {
      ok = false;
      const std::string diff = Snapshot(*model, &opt, &gen).diff(before);
      if (!diff.empty()) FAIL("mutation " << i << ": " << e.what() << " changed " << diff);
      if (std::string(e.what()).find(path) == std::string::npos)
        FAIL("mutation " << i << ": the message does not name the file: " << e.what());
    }
    if (ok) {
      ++loaded;
      load(good_path, *model, &opt, &gen);  // back to the saved state
    } else {
      ++failed;
    }
  }
  INFO("loaded " << loaded << ", failed " << failed);
  CHECK(loaded > 500);  // data flips and harmless header changes
  CHECK(failed > 5000);
}
