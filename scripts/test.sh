#!/usr/bin/env bash
# Installs what is missing, then builds and runs every test twice: the main build in build/
# (Release, warnings as errors; what scripts/demo.sh built is reused), and an address + undefined-behaviour sanitizer build in build-asan/; then the threaded
# tests (several threads calling one static function) under ThreadSanitizer in build-tsan/.
set -euo pipefail
cd "$(dirname "$0")/.."

total_start=$SECONDS
phase_start=$SECONDS
# Prints the time since the last call (or the start) under a label.
phase_done() {
  echo "==> $1: $((SECONDS - phase_start)) s"
  phase_start=$SECONDS
}

scripts/setup.sh
phase_done "packages"

scripts/setup.sh main
phase_done "build (build/)"

(cd build && ctest --output-on-failure -j2)
phase_done "tests (build/)"

# The CUDA code is compiled (and, on a GPU machine, tested) in build/; the sanitizer build leaves
# it out (ASan's shadow memory and the CUDA driver's address reservations do not mix).
# -O1 -g1 (line tables: the sanitizers' stack traces keep file and line) compiles in about half
# the time of -O2 -g. MPI is left out as well: LeakSanitizer reports Open MPI's own allocations
# (an MPI program of four calls leaks some 120 KB in 3,300 allocations with Open MPI 4.1), none
# of them encore's, and suppressing them all would hide encore's behind them; the sanitizer
# builds test encore::dist as the world of one process (dist/single_backend.cc), and the
# two-rank tests run in build/.
sanitizer_flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
  -DENCORE_WERROR=ON -DENCORE_CUDA=OFF -DENCORE_MPI=OFF -DENCORE_BUILD_BENCH=OFF
  -DENCORE_BUILD_SAMPLES=OFF)
scripts/setup.sh build-asan -DENCORE_SANITIZE=address,undefined "${sanitizer_flags[@]}"
phase_done "build (build-asan/, address,undefined)"

# allocator_may_return_null: a test asks for 4 TiB and expects encore's out-of-memory Error.
# ENCORE_STATIC_REDZONE: guard bytes between the arena's buffers, checked after every replayed
# step (an overrun that stays inside one arena is invisible to AddressSanitizer).
(cd build-asan &&
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ENCORE_STATIC_REDZONE=1 ctest --output-on-failure -j2)
phase_done "tests (build-asan/, address,undefined)"

# Only the threaded tests' binary (several threads calling one static function, two-lane
# replays): the rest of the suite runs its threads through the same pool. OpenBLAS's own
# threads are not instrumented, so it runs on the calling thread.
cmake -S . -B build-tsan -DENCORE_SANITIZE=thread "${sanitizer_flags[@]}"
cmake --build build-tsan -j "$(nproc)" --target encore_thread_tests
phase_done "build (build-tsan/, thread)"

OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  build-tsan/tests/encore_thread_tests
phase_done "threaded tests (build-tsan/, thread)"

echo "==> all tests passed in $((SECONDS - total_start)) s"
