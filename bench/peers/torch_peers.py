#!/usr/bin/env python3
"""MlpSmall, MlpLarge and SeedCnn training steps in PyTorch: eager and torch.compile.

Run with the torch venv (see README.md):
    bench/peers/.venv-torch/bin/python bench/peers/torch_peers.py [--json] [--filter MlpSmall]

One thread (torch.set_num_threads(1), OMP/MKL/OpenBLAS at 1), float32, CPU.
Prints `Case/impl   time ms   cpu ms   iterations`, the median over --repetitions.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

_harness.single_thread_env()
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # CPU only; no CUDA probing
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # no compile worker pool

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

IMPLS = ("torch_eager", "torch_compile")
# torch.compile needs a few calls before it stops recompiling (the first call traces,
# the step's optimizer state appears after it, ...); these run before the timing, untimed
# in the step time and reported as compile_s.
COMPILE_WARMUP_STEPS = 5


def mlp(hidden):
    return nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 10))


class SeedCnn(nn.Module):
    """Chainer's MNISTCONV (the static-subgraph reference): 3 convs 3x3 pad 1, relu, pool, linear."""

    def __init__(self, ch=8):
        super().__init__()
        self.c1 = nn.Conv2d(1, ch, 3, padding=1)
        self.c2 = nn.Conv2d(ch, ch, 3, padding=1)
        self.c3 = nn.Conv2d(ch, ch, 3, padding=1)
        self.l1 = nn.Linear(14 * 14 * ch, 10)

    def forward(self, x):
        h = self.c3(self.c2(self.c1(x)))
        h = F.max_pool2d(F.relu(h), 2)
        return self.l1(h.flatten(1))


def make_case(case):
    """(model, optimizer, x, labels) with fixed random data."""
    torch.manual_seed(0)
    if case == "MlpSmall":
        model, batch, shape = mlp(100), 32, (784,)
    elif case == "MlpLarge":
        model, batch, shape = mlp(1000), 100, (784,)
    elif case == "SeedCnn":
        model, batch, shape = SeedCnn(), 32, (1, 28, 28)
    else:
        raise ValueError(case)
    if case == "SeedCnn":
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)  # PyTorch defaults otherwise
    x = torch.rand(batch, *shape)
    labels = torch.randint(0, 10, (batch,))
    return model, opt, x, labels


def make_step(model, opt, x, labels):
    def step():
        opt.zero_grad()  # set_to_none=True, PyTorch's default
        loss = F.cross_entropy(model(x), labels)  # softmax cross-entropy, mean
        loss.backward()
        opt.step()
        return loss

    return step


def builder(case, impl):
    def build():
        model, opt, x, labels = make_case(case)
        step = make_step(model, opt, x, labels)
        if impl == "torch_eager":
            return step, {}
        # The whole step under torch.compile (inductor, default mode): Dynamo breaks the graph
        # at loss.backward(); the forward and loss become one compiled graph with an
        # AOTAutograd-compiled backward, and opt.step() (Dynamo resumes after the break)
        # another compiled graph.
        compiled = torch.compile(step)
        t0 = time.perf_counter()
        for _ in range(COMPILE_WARMUP_STEPS):
            compiled()
        return compiled, {"compile_s": time.perf_counter() - t0}

    return build


def main():
    args = _harness.parse_args(__doc__.splitlines()[0], IMPLS)
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    versions = {"torch": torch.__version__}
    notes = {
        "torch_compile": "torch.compile(step) of the whole step (default mode, inductor); "
                         f"{COMPILE_WARMUP_STEPS} compile/warm-up calls excluded (compile_s)",
        "blas": "MKL" if torch.backends.mkl.is_available() else "other",
    }
    if not args.json:
        _harness.print_header("torch", versions)
    builders = {(c, i): builder(c, i) for c in _harness.CASES for i in IMPLS}
    _harness.run_cases("torch", builders, args, versions, notes)


if __name__ == "__main__":
    main()
