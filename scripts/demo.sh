#!/usr/bin/env bash
# Installs what is missing, builds the demo in build/ (the build scripts/test.sh reuses), and
# trains the seed CNN on Fashion-MNIST for one epoch eagerly and one epoch with its forward
# static, then compares.
# Arguments go to the demo (samples/mnist_cnn --compare), e.g. scripts/demo.sh --seed 1
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh main mnist_cnn
build/samples/mnist_cnn --compare "$@"
