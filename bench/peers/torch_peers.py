#!/usr/bin/env python3
"""encore_bench's training steps in PyTorch: eager and torch.compile.

Run with the torch venv (see README.md):
    bench/peers/.venv-torch/bin/python bench/peers/torch_peers.py [--json] [--filter MlpSmall]
    bench/peers/.venv-torch/bin/python bench/peers/torch_peers.py --filter 'CharLstm|TinyGpt|Chain'

The cases (_harness.CASES; models and data in _torch_models.py): MlpSmall, MlpLarge, SeedCnn,
CharLstm, TinyGpt, LstmCellChain.

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
from _torch_models import make_case, make_step  # noqa: E402

IMPLS = ("torch_eager", "torch_compile")
# torch.compile needs a few calls before it stops recompiling (the first call traces,
# the step's optimizer state appears after it, ...); these run before the timing, untimed
# in the step time and reported as compile_s.
COMPILE_WARMUP_STEPS = 5


def builder(case, impl):
    def build():
        model, opt, x, labels = make_case(case)
        step = make_step(model, opt, x, labels)
        if impl == "torch_eager":
            return step, {}
        # The whole step under torch.compile (inductor, default mode): Dynamo breaks the graph
        # at loss.backward(); the forward and loss become one compiled graph with an
        # AOTAutograd-compiled backward, and opt.step() (Dynamo resumes after the break)
        # another compiled graph. LstmCellChain's 35 cell steps are unrolled into one graph.
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
