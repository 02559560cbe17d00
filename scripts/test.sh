#!/usr/bin/env bash
# Installs what is missing, then builds and runs every test twice: a warnings-as-errors build in
# build/, and an address + undefined-behaviour sanitizer build in build-asan/.
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

scripts/setup.sh build -DENCORE_WERROR=ON
phase_done "build (build/, -Werror)"

(cd build && ctest --output-on-failure -j2)
phase_done "tests (build/)"

# The CUDA code is compiled (and, on a GPU machine, tested) in build/; the sanitizer build leaves
# it out (ASan's shadow memory and the CUDA driver's address reservations do not mix).
scripts/setup.sh build-asan -DENCORE_SANITIZE=address,undefined -DENCORE_WERROR=ON -DENCORE_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DENCORE_BUILD_BENCH=OFF -DENCORE_BUILD_SAMPLES=OFF
phase_done "build (build-asan/, address,undefined)"

(cd build-asan &&
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --output-on-failure -j2)
phase_done "tests (build-asan/, address,undefined)"

echo "==> all tests passed in $((SECONDS - total_start)) s"
