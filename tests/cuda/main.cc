// The CUDA test binary's main: a Catch2 session, or exit code 77 (ctest: skipped) when no CUDA
// device can be used. Listings (catch_discover_tests runs --list-test-names-only at build time)
// work without a device.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>
#include <string_view>

#include "runtime/cuda.h"

namespace {

constexpr int kSkipped = 77;

// Whether the arguments ask Catch for a listing or its help instead of a test run.
bool lists_only(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    for (std::string_view listing :
         {"-l", "--list-tests", "--list-test-names-only", "-t", "--list-tags", "--list-reporters",
          "-h", "-?", "--help", "--version"})
      if (a == listing) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (!lists_only(argc, argv) && !encore::cuda::is_available()) {
    std::printf("skipped: %s\n", encore::cuda::unavailable_reason().c_str());
    return kSkipped;
  }
  const int failed = Catch::Session().run(argc, argv);
  // Catch returns the number of failed assertions: 77 of them must not read as a skip.
  return failed == kSkipped ? kSkipped + 1 : failed;
}
