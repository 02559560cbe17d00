#!/usr/bin/env bash
# Installs what is missing, builds encore (Release) in build/ and trains the Fashion-MNIST MLP.
# Arguments go to the demo, e.g. scripts/demo.sh --epochs 1
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh build -DCMAKE_BUILD_TYPE=Release -DENCORE_BUILD_SAMPLES=ON
build/samples/train_mlp "$@"
