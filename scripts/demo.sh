#!/usr/bin/env bash
# Installs what is missing, builds encore (Release) in build/ and trains the seed CNN on
# Fashion-MNIST for one epoch eagerly and one epoch with its forward static, then compares.
# Arguments go to the demo (samples/mnist_cnn --compare), e.g. scripts/demo.sh --seed 1
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh build -DCMAKE_BUILD_TYPE=Release -DENCORE_BUILD_SAMPLES=ON
build/samples/mnist_cnn --compare "$@"
