#!/usr/bin/env python3
"""encore_bench's training steps in PyTorch on a GPU: eager, CUDA graph, torch.compile.

Run with the torch venv (see README.md) on a machine with an NVIDIA GPU:
    bench/peers/.venv-torch/bin/python bench/peers/torch_cuda_peers.py [--json] [--filter MlpSmall]

The same cases, models, data, losses and optimizers as torch_peers.py (MlpSmall, MlpLarge, SeedCnn,
CharLstm, TinyGpt, LstmCellChain; made on the CPU with seed 0, then moved to cuda), float32.
Every step ends with torch.cuda.synchronize(), as every iteration of encore_bench's /cuda cases
ends with a synchronize, so a step's time is the time to finish it.
Prints `Case/impl   time ms   cpu ms   iterations`, the median over --repetitions.

  torch_eager    the step as in torch_peers.py (Adam/AdamW: PyTorch's default on CUDA, foreach).
  torch_graph    the whole step (forward, loss, backward, optimizer update) captured once in a
                 CUDA graph (torch.cuda.graph, PyTorch's "whole network capture" recipe: warm-up
                 steps on a side stream, gradients set to None before capture, Adam/AdamW with
                 capturable=True); each step copies the batch into the graph's static input
                 tensors and replays the graph. LstmCellChain has no optimizer: forward and
                 backward are captured.
  torch_compile  torch.compile(step, mode="reduce-overhead"): inductor with CUDA graphs (cudagraph
                 trees); compile and warm-up calls excluded from the time (compile_s).

Exits with an error when torch.cuda.is_available() is false.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

_harness.single_thread_env()
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # no compile worker pool

import torch  # noqa: E402
from _torch_models import loss_of, make_case, make_step, zero_grad  # noqa: E402

IMPLS = ("torch_eager", "torch_graph", "torch_compile")
DEVICE = "cuda"
# Eager steps on a side stream before the capture: they create the gradients and the optimizer
# state and let cuBLAS/cuDNN set themselves up outside the capture.
CAPTURE_WARMUP_STEPS = 3
# torch.compile recompiles during its first calls (the optimizer state appears after the first);
# with reduce-overhead the cudagraph trees record after a few more. Untimed, reported as compile_s.
COMPILE_WARMUP_STEPS = 5


def require_cuda():
    if torch.cuda.is_available():
        return
    sys.exit(f"torch_cuda_peers.py: no CUDA device: torch.cuda.is_available() is False "
             f"(torch {torch.__version__}, CUDA {torch.version.cuda}, CUDA_VISIBLE_DEVICES="
             f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}); run it on a machine with an NVIDIA "
             f"GPU and its driver")


def eager_step(case):
    return make_step(*make_case(case, DEVICE)), {}


def graph_step(case):
    t0 = time.perf_counter()
    # capturable=True keeps Adam's (AdamW's) step count on the device, which graph capture
    # requires. SeedCnn's SGD needs nothing; LstmCellChain has no optimizer.
    adam = {} if case in ("SeedCnn", "LstmCellChain") else {"capturable": True}
    model, opt, x, labels = make_case(case, DEVICE, **adam)
    static_x = x.clone()
    static_labels = None if labels is None else labels.clone()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(CAPTURE_WARMUP_STEPS):
            zero_grad(model, opt)
            loss_of(model, static_x, static_labels).backward()
            if opt is not None:
                opt.step()
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    # The captured backward allocates the gradients from the graph's private pool; every replay
    # writes them anew (no accumulation), which is the step's zero_grad.
    zero_grad(model, opt)
    with torch.cuda.graph(graph):
        loss = loss_of(model, static_x, static_labels)
        loss.backward()
        if opt is not None:
            opt.step()
    torch.cuda.synchronize()

    def step():
        static_x.copy_(x)  # a training loop's new batch; here the same one every step
        if static_labels is not None:
            static_labels.copy_(labels)
        graph.replay()

    return step, {"capture_s": time.perf_counter() - t0}


def compile_step(case):
    compiled = torch.compile(make_step(*make_case(case, DEVICE)), mode="reduce-overhead")
    mark_step = getattr(torch.compiler, "cudagraph_mark_step_begin", None)

    def step():
        if mark_step is not None:
            mark_step()  # a new training step: the previous step's graph outputs may be reused
        compiled()

    t0 = time.perf_counter()
    for _ in range(COMPILE_WARMUP_STEPS):
        step()
    torch.cuda.synchronize()
    return step, {"compile_s": time.perf_counter() - t0}


BUILDERS = {"torch_eager": eager_step, "torch_graph": graph_step, "torch_compile": compile_step}


def main():
    args = _harness.parse_args(__doc__.splitlines()[0], IMPLS)
    require_cuda()
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    # cuDNN picks its convolution algorithms by measurement, once per shape (as encore does).
    torch.backends.cudnn.benchmark = True
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version(),
                "gpu": f"{props.name} ({props.total_memory / 2**30:.0f} GiB, "
                       f"sm_{props.major}{props.minor})"}
    notes = {
        "device": f"{DEVICE}:{torch.cuda.current_device()} {props.name}; every step ends with "
                  "torch.cuda.synchronize()",
        "torch_graph": "the whole step captured with torch.cuda.graph (Adam/AdamW "
                       "capturable=True); each step copies x and labels into the static inputs "
                       "and replays; "
                       f"{CAPTURE_WARMUP_STEPS} side-stream warm-up steps and the capture excluded "
                       "(capture_s)",
        "torch_compile": "torch.compile(step, mode='reduce-overhead') of the whole step; "
                         f"{COMPILE_WARMUP_STEPS} compile/warm-up calls excluded (compile_s)",
        "math": f"cudnn.benchmark=True, matmul allow_tf32="
                f"{torch.backends.cuda.matmul.allow_tf32}, cudnn allow_tf32="
                f"{torch.backends.cudnn.allow_tf32}",
    }
    if not args.json:
        _harness.print_header("torch", versions)
    builders = {(c, i): (lambda c=c, i=i: BUILDERS[i](c)) for c in _harness.CASES for i in IMPLS}
    _harness.run_cases("torch_cuda", builders, args, versions, notes, sync=torch.cuda.synchronize)


if __name__ == "__main__":
    main()
