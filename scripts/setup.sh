#!/usr/bin/env bash
# Installs the Debian packages encore needs (only the missing ones), then configures and builds.
#
#   scripts/setup.sh                          # packages only
#   scripts/setup.sh main [TARGET...]         # the main build, build/ (Release, warnings as
#                                             # errors): the demo and the tests share it
#   scripts/setup.sh DIR [CMAKE_ARGS...]      # another build directory (the sanitizer builds)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake g++ make pkg-config libabsl-dev catch2 libbenchmark-dev libopenblas-dev
          zlib1g-dev nlohmann-json3-dev libonnx-dev libprotobuf-dev libopenmpi-dev openmpi-bin
          dataset-fashion-mnist fortunes)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install packages" >&2; exit 1; }
    sudo=(sudo)
  fi
  "${sudo[@]}" apt-get update
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${missing[@]}"
fi

# The Python modules the interop tests use (checkpoint_interop, onnx_runtime_check): pip installs
# the missing ones, best effort and quietly; offline those tests are skipped (exit 77), so this
# never fails the run. PIP_BREAK_SYSTEM_PACKAGES lets Debian's own python3 take them.
python_modules=(numpy safetensors onnxruntime)
if command -v python3 >/dev/null; then
  missing_py=()
  for m in "${python_modules[@]}"; do
    python3 -c "import $m" 2>/dev/null || missing_py+=("$m")
  done
  if ((${#missing_py[@]})); then
    echo "setup: pip install ${missing_py[*]} (best effort)"
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet --disable-pip-version-check \
      --retries 1 --timeout 15 "${missing_py[@]}" >/dev/null 2>&1 ||
      echo "setup: could not install ${missing_py[*]}; the tests that need them will be skipped"
  fi
fi

if (($# == 0)); then
  exit 0
fi
if [[ $1 == main ]]; then
  shift
  targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  # The same arguments on every call, so a second call rebuilds nothing the first built.
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DENCORE_WERROR=ON
  cmake --build build -j "$(nproc)" "${targets[@]}"
else
  build_dir=$1
  shift
  cmake -S . -B "$build_dir" "$@"
  cmake --build "$build_dir" -j "$(nproc)"
fi
