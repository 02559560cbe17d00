#!/usr/bin/env python3
"""MlpSmall, MlpLarge and SeedCnn training steps in Chainer: eager and @static_graph.

Only these three: the sequence cases of encore_bench (CharLstm, TinyGpt, LstmCellChain) have no
Chainer peer, and show as n/a (not ported).

Run with the chainer venv (see README.md):
    bench/peers/.venv-chainer/bin/python bench/peers/chainer_peers.py [--json] [--filter MlpSmall]

One thread (OpenBLAS/OMP/MKL at 1), float32, CPU (numpy). Prints `Case/impl   time ms   cpu ms
iterations`, the median over --repetitions.

chainer_static is Chainer's static subgraph optimization: the model's forward (to the logits)
is decorated with chainer.static_graph, as in the MNISTCONV example of the reference
(shared/references/chainer-static-subgraph-optimizations.txt); the loss, backward and the
optimizer update stay outside it, as there. The first call traces and builds the forward
schedule, the first backward the backward schedule; later calls replay both.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

_harness.single_thread_env()

import numpy as np  # noqa: E402
import chainer  # noqa: E402
import chainer.functions as F  # noqa: E402
import chainer.links as L  # noqa: E402

IMPLS = ("chainer_eager", "chainer_static")
# The cases of _harness.CASES with a Chainer peer; the others print as n/a.
CHAINER_CASES = ("MlpSmall", "MlpLarge", "SeedCnn")


class Mlp(chainer.Chain):
    def __init__(self, hidden):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(784, hidden)
            self.l2 = L.Linear(hidden, hidden)
            self.l3 = L.Linear(hidden, 10)

    def forward(self, x):
        h = F.relu(self.l1(x))
        h = F.relu(self.l2(h))
        return self.l3(h)


class StaticMlp(Mlp):
    @chainer.static_graph
    def forward(self, x):
        return super().forward(x)


class SeedCnn(chainer.Chain):
    """MNISTCONV from the reference: 3 convs 3x3 pad 1, relu, max_pool 2x2, linear 1568->10."""

    def __init__(self, ch=8):
        super().__init__()
        with self.init_scope():
            self.c1 = L.Convolution2D(1, ch, ksize=3, stride=1, pad=1)
            self.c2 = L.Convolution2D(ch, ch, ksize=3, stride=1, pad=1)
            self.c3 = L.Convolution2D(ch, ch, ksize=3, stride=1, pad=1)
            self.l1 = L.Linear(14 * 14 * ch, 10)

    def forward(self, x):
        h = self.c3(self.c2(self.c1(x)))
        h = F.max_pooling_2d(F.relu(h), 2)
        return self.l1(h)


class StaticSeedCnn(SeedCnn):
    # The reference's static_forward, applied here on CPU too (the reference itself only
    # takes that branch when the input is not a numpy array).
    @chainer.static_graph
    def forward(self, x):
        return super().forward(x)


def make_case(case, static):
    """(model, optimizer, x, labels) with fixed random data."""
    np.random.seed(0)
    if case == "MlpSmall":
        model, batch, shape = (StaticMlp if static else Mlp)(100), 32, (784,)
        opt = chainer.optimizers.Adam(alpha=1e-3)  # beta1 .9, beta2 .999, eps 1e-8 (= PyTorch)
    elif case == "MlpLarge":
        model, batch, shape = (StaticMlp if static else Mlp)(1000), 100, (784,)
        opt = chainer.optimizers.Adam(alpha=1e-3)
    elif case == "SeedCnn":
        model, batch, shape = (StaticSeedCnn if static else SeedCnn)(), 32, (1, 28, 28)
        opt = chainer.optimizers.SGD(lr=0.01)
    else:
        raise ValueError(case)
    opt.setup(model)
    x = np.random.rand(batch, *shape).astype(np.float32)
    labels = np.random.randint(0, 10, size=batch).astype(np.int32)
    return model, opt, x, labels


def make_step(model, opt, x, labels):
    def step():
        model.cleargrads()
        loss = F.softmax_cross_entropy(model.forward(x), labels)  # mean over the batch
        loss.backward()
        opt.update()
        return loss

    return step


def builder(case, impl):
    def build():
        model, opt, x, labels = make_case(case, impl == "chainer_static")
        return make_step(model, opt, x, labels), {}

    return build


def main():
    args = _harness.parse_args(__doc__.splitlines()[0], IMPLS)
    versions = {"chainer": chainer.__version__, "numpy": np.__version__}
    notes = {"chainer_static": "chainer.static_graph on the model's forward (to the logits); "
                               "loss, backward and update outside, as in the reference"}
    if not args.json:
        _harness.print_header("chainer", versions)
    builders = {(c, i): builder(c, i) for c in CHAINER_CASES for i in IMPLS}
    _harness.run_cases("chainer", builders, args, versions, notes,
                       missing="not ported to Chainer (its peers are the MLP and CNN cases only)")


if __name__ == "__main__":
    main()
