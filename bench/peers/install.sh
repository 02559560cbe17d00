#!/bin/sh
# Installs the peers into bench/peers/.venv-torch and bench/peers/.venv-chainer (optional;
# not part of CI). Needs python3.11 (or PYTHON=...) and PyPI; about 5.5 GB and a few minutes.
set -eu
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}

"$PYTHON" -m venv .venv-torch
.venv-torch/bin/pip install -r requirements-torch.txt

"$PYTHON" -m venv .venv-chainer
.venv-chainer/bin/pip install "setuptools<70" wheel
.venv-chainer/bin/pip install --no-build-isolation -r requirements-chainer.txt

.venv-torch/bin/python -c 'import torch; print("torch", torch.__version__)'
OPENBLAS_NUM_THREADS=1 .venv-chainer/bin/python -c 'import chainer, numpy; print("chainer", chainer.__version__, "numpy", numpy.__version__)'
