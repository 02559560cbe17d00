#!/usr/bin/env bash
# Packs what the CUDA tests, the /cuda benchmarks, the GPU peers and the GPU demo need into .gpu/
# at the project root (git-ignored), for a GPU machine that has the NVIDIA driver, CUDA 13,
# cuBLAS, cuDNN 9, NCCL, NVRTC and PyTorch (its wheels bring the CUDA libraries) but none of the
# build's other libraries and no package registry. From the project root:
#   scripts/gpu/pack.sh [--no-data]
# Then on the GPU machine, from the project root, with .gpu/ copied along:
#   bash .gpu/on-device.sh tests     # encore_cuda_tests, then compute-sanitizer
#   bash .gpu/on-device.sh bench     # /cuda benchmarks with their breakdowns, PyTorch side by side,
#                                    # the GPU demo
#   bash .gpu/on-device.sh quick     # the most wanted parts of both in one call
# Each fits one 10-minute call; everything they print is also kept in $GPU_OUT.
# The pack stays under the 64 MiB a device call carries: the CUDA libraries the machine brings
# (driver, cuBLAS, cuDNN, NCCL, NVRTC) are left out and found there by on-device.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(git rev-parse --show-toplevel)
cd "$root"
build=${GPU_BUILD:-build-gpu}
# Portable host code (the GPU machine's CPU is not this one); sm_90 for H100/H200.
mkdir -p "$build"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DENCORE_NATIVE=OFF -DENCORE_CUDA=ON \
  -DENCORE_WERROR=OFF -DCMAKE_CUDA_ARCHITECTURES=90 >"$build/configure.log" 2>&1 ||
  { tail -20 "$build/configure.log"; exit 1; }
cmake --build "$build" -j"$(nproc)" --target encore_cuda_tests encore_bench mnist_cnn
out=.gpu
stage=$(mktemp -d)
rm -rf "$out"; mkdir -p "$stage/bin" "$stage/lib" "$out/peers"
cp "$build/tests/encore_cuda_tests" "$build/bench/encore_bench" \
   "$build/samples/mnist_cnn" "$stage/bin/"
# The shared libraries the binaries resolve here (under the names the loader asks for), except
# the C runtime and the CUDA libraries the GPU machine brings; cudart and CUPTI are small and kept.
for b in "$stage"/bin/*; do ldd "$b"; done | awk '/=> \//{print $1" "$3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda|libcublas|libcublasLt|libcudnn[a-z_]*|libnccl|libnvrtc[a-z-]*)\.so' |
  while read -r name lib; do cp -L "$lib" "$stage/lib/$name"; done
strip --strip-unneeded "$stage"/bin/* "$stage"/lib/*.so* 2>/dev/null || true
tar -cJf "$out/payload.tar.xz" -C "$stage" bin lib && rm -rf "$stage"
cp bench/peers/*.py "$out/peers/"
cp "$here/on-device.sh" "$out/"
if [ "${1:-}" != "--no-data" ] && [ -d /usr/share/datasets/fashion-mnist ]; then
  mkdir -p "$out/data" && cp /usr/share/datasets/fashion-mnist/*.gz "$out/data/"
fi
exclude="$(git rev-parse --git-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")"
for p in /.gpu/ "/$build/"; do grep -qxF "$p" "$exclude" 2>/dev/null || echo "$p" >>"$exclude"; done
size_kib=$(du -sk "$out" | cut -f1)
echo "packed: $((size_kib / 1024)) MiB in $out"
if ((size_kib > 60 * 1024)); then
  echo "pack.sh: $out is over 60 MiB; a device call carries 64 MiB in all (--no-data saves 30)" >&2
  exit 1
fi
check=$(mktemp -d); tar -xJf "$out/payload.tar.xz" -C "$check"
missing=$(LD_LIBRARY_PATH="$check/lib" ldd "$check"/bin/* | grep "not found" |
  grep -v -E 'lib(cuda|cublas|cublasLt|cudnn[a-z_]*|nccl|nvrtc)\.so' || true)
rm -rf "$check"
[ -z "$missing" ] || { echo "pack.sh: the pack lacks $missing" >&2; exit 1; }
