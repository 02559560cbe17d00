#!/usr/bin/env python3
"""Runs encore_bench and the peer scripts one after the other and prints one table.

    python3 bench/peers/compare.py [build/bench/encore_bench] [--metric real|cpu|both]
    python3 bench/peers/compare.py [build/bench/encore_bench] --cuda     # on a GPU machine

Standard library only; the peers run in their own venvs (bench/peers/.venv-torch,
bench/peers/.venv-chainer, see README.md). A peer whose venv is missing, a case that our
binary does not have, or a case that fails shows as n/a, with the reason under the table.
Everything runs single-threaded (OPENBLAS_NUM_THREADS=1, ENCORE_NUM_THREADS=1, OMP_NUM_THREADS=1,
MKL_NUM_THREADS=1,
torch.set_num_threads(1)). Each cell is the median over the repetitions of ms per training
step; the ratio in brackets is that cell over `encore static` (above 1: slower than encore
static).

--cuda (--device cuda): our /cuda cases (eager, static with CUDA graphs, static_nograph, and
KernelSum's summed kernel time) against torch_cuda_peers.py (PyTorch eager, a CUDA graph of the
whole step, torch.compile reduce-overhead); the ratio is then over `encore static` with graphs.
"""

import argparse
import json
import os
import platform
import re
import signal
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# The rows, in order: encore_bench's MLP and CNN steps (bench/mlp_step.h, bench/cnn_bench.cc) and
# its sequence-model steps (bench/sequence_step.h). Chainer has peers of the first three only.
CASES = ("MlpSmall", "MlpLarge", "SeedCnn", "CharLstm", "TinyGpt", "LstmCellChain")
CASE_RE = "|".join(CASES)


class Setup:
    """What one mode compares: the table's columns (key, header), the column the ratios divide
    by, our cases (a --benchmark_filter regex and the names it should match, for a case-by-case
    rerun) and the peers (framework, script, the option naming its python)."""

    def __init__(self, columns, base, encore_filter, encore_names, peers):
        self.columns, self.base = columns, base
        self.encore_filter, self.encore_names, self.peers = encore_filter, encore_names, peers


# Google Benchmark appends /real_time to a UseRealTime() case's name for --benchmark_filter
# (main.cc strips it from the reported names only), so the filters allow a suffix.
CPU = Setup(
    columns=(
        ("encore/eager", "encore eager"),
        ("encore/static", "encore static"),
        ("torch/torch_eager", "torch eager"),
        ("torch/torch_compile", "torch.compile"),
        ("chainer/chainer_eager", "chainer eager"),
        ("chainer/chainer_static", "chainer static_graph"),
    ),
    base="encore/static",
    encore_filter=rf"^({CASE_RE})/(eager|static)(/|$)",
    encore_names=[f"{c}/{i}" for c in CASES for i in ("eager", "static")],
    peers=(("torch", "torch_peers.py", "torch_python"),
           ("chainer", "chainer_peers.py", "chainer_python")),
)
# KernelSum/<case>/cuda reports the summed device time of the step's kernels in its kernel_us
# counter; parse_encore() files it as <case>/kernel_sum.
CUDA = Setup(
    columns=(
        ("encore/eager/cuda", "encore eager"),
        ("encore/static_nograph/cuda", "encore static, no graphs"),
        ("encore/static/cuda", "encore static"),
        ("encore/kernel_sum", "kernel sum"),
        ("torch/torch_eager", "torch eager"),
        ("torch/torch_graph", "torch CUDA graph"),
        ("torch/torch_compile", "torch.compile reduce-overhead"),
    ),
    base="encore/static/cuda",
    encore_filter=rf"^(({CASE_RE})/(eager|static|static_nograph)/cuda"
                  rf"|KernelSum/({CASE_RE})/cuda)(/|$)",
    encore_names=[f"{c}/{i}/cuda" for c in CASES for i in ("eager", "static", "static_nograph")]
    + [f"KernelSum/{c}/cuda" for c in CASES],
    peers=(("torch", "torch_cuda_peers.py", "torch_python"),),
)
SINGLE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                 "ENCORE_NUM_THREADS": "1"}
TO_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}


def env():
    e = dict(os.environ)
    e.update(SINGLE_THREAD)
    return e


def _encore_cmd(binary, case_filter, repetitions, min_time):
    cmd = [binary, f"--benchmark_filter={case_filter}", f"--benchmark_repetitions={repetitions}",
           "--benchmark_report_aggregates_only=true", "--benchmark_format=json"]
    if min_time is not None:
        cmd.append(f"--benchmark_min_time={min_time}")
    return cmd


def _run_json(cmd):
    """(parsed stdout, None) or (None, why it failed) for a command printing JSON."""
    print("+ OPENBLAS_NUM_THREADS=1 ENCORE_NUM_THREADS=1 " + " ".join(cmd), file=sys.stderr)
    p = subprocess.run(cmd, env=env(), capture_output=True, text=True)
    if p.returncode < 0:
        try:
            sig = signal.Signals(-p.returncode).name
        except ValueError:
            sig = f"signal {-p.returncode}"
        return None, f"crashed ({sig})"
    try:
        return json.loads(p.stdout), None
    except json.JSONDecodeError:
        lines = (p.stderr.strip() or p.stdout.strip() or f"exit {p.returncode}").splitlines()
        return None, lines[-1].strip()


def encore_key(name):
    """Where a case's result goes: KernelSum/MlpSmall/cuda -> MlpSmall/kernel_sum."""
    m = re.fullmatch(r"KernelSum/([^/]+)/cuda", name)
    return f"{m.group(1)}/kernel_sum" if m else name


def parse_encore(data):
    """{"MlpSmall/eager": {"ms":..., "cpu_ms":...} or {"error":...}} from encore_bench's JSON.

    A KernelSum case gives its kernel_us counter (device time, in both metrics) instead of its
    time column, and its replay_us as replay_ms.
    """
    out = {}
    for b in data.get("benchmarks", []):
        name = b.get("run_name", b["name"])
        name = encore_key(re.sub(r"/(real_time|manual_time|min_time:[^/]*)", "", name))
        if b.get("error_occurred"):
            out[name] = {"error": b.get("error_message", "error")}
            continue
        if b.get("aggregate_name") not in ("median", None):
            continue
        if name.endswith("/kernel_sum"):
            if "kernel_us" not in b:
                out[name] = {"error": "no kernel_us counter in encore_bench's output"}
                continue
            out[name] = {"ms": b["kernel_us"] * 1e-3, "cpu_ms": b["kernel_us"] * 1e-3}
            if "replay_us" in b:
                out[name]["replay_ms"] = b["replay_us"] * 1e-3
            continue
        scale = TO_MS[b.get("time_unit", "ns")]
        out[name] = {"ms": b["real_time"] * scale, "cpu_ms": b["cpu_time"] * scale}
    return out


def run_encore(setup, binary, repetitions, min_time):
    """The medians of our cases, the context, and an error for the whole run (or None).

    If the run as a whole fails (a crash in one case loses the JSON of all), each case runs
    alone, so that only the failing ones show as n/a.
    """
    if not os.path.exists(binary):
        return {}, {}, f"{binary} not found (build it: make -C build encore_bench)"
    data, err = _run_json(_encore_cmd(binary, setup.encore_filter, repetitions, min_time))
    if data is not None:
        return parse_encore(data), data.get("context", {}), None
    print(f"encore_bench {err}; running its cases one by one", file=sys.stderr)
    out, context = {}, {}
    for name in setup.encore_names:
        d, e = _run_json(_encore_cmd(binary, f"^{name}(/|$)", repetitions, min_time))
        if d is None:
            if "Failed to match any benchmarks" in e:
                e = "not in this binary" if setup is CPU else (
                    "not registered (the /cuda cases need a build with CUDA and a visible GPU; "
                    "see the 'cuda' line of encore_bench's context)")
            out[encore_key(name)] = {"error": f"encore_bench: {e}"}
            continue
        context = context or d.get("context", {})
        out.update(parse_encore(d))
    return out, context, None


def load_encore(path):
    with open(path) as f:
        data = json.load(f)
    return parse_encore(data), data.get("context", {}), None


def run_peer(script, python, repetitions, min_time):
    """{"MlpSmall/torch_eager": {...}}, the context, or an error for the whole script."""
    # A path, or a command name looked up on PATH (--torch-python python3).
    found = python if os.sep in python else shutil.which(python)
    if found is None or not os.path.exists(found):
        return {}, {}, f"not installed ({os.path.relpath(python, ROOT)} missing; see README.md)"
    python = found
    cmd = [python, os.path.join(HERE, script), "--json", f"--repetitions={repetitions}"]
    if min_time is not None:
        cmd.append(f"--min-time={min_time}")
    print("+ " + " ".join(cmd), file=sys.stderr)
    p = subprocess.run(cmd, env=env(), capture_output=True, text=True)
    try:
        data = json.loads(p.stdout)
    except json.JSONDecodeError:
        tail = (p.stderr.strip() or f"exit {p.returncode}").splitlines()[-1]
        return {}, {}, tail if tail.startswith(script) else f"{script}: {tail}"
    return {b["name"]: b for b in data["benchmarks"]}, data["context"], None


def gpus():
    """nvidia-smi's GPUs ("name, driver, memory" each), [] when it lists none or fails, None
    when there is no nvidia-smi."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True)
    except OSError:
        return None
    if p.returncode != 0:
        return []
    return [line.strip() for line in p.stdout.splitlines() if line.strip()]


def machine():
    """lscpu's model name, family/model, cores and the widest SIMD, in one line."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return f"{platform.processor() or '?'}, {os.cpu_count()} CPUs"
    f = dict(re.findall(r"^([^:\n]+):\s*(.*)$", out, re.M))
    flags = f.get("Flags", "").split()
    simd = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    parts = [f.get("Model name", "?"),
             f"family {f.get('CPU family', '?')} model {f.get('Model', '?')}",
             f"{os.cpu_count()} CPUs ({f.get('Thread(s) per core', '?')} thread(s) per core)",
             simd]
    if f.get("Hypervisor vendor"):
        parts.append(f"{f['Hypervisor vendor']} guest")
    return ", ".join(parts)


def fmt(setup, results, case, key, metric, notes):
    r = results.get(f"{case}/{key}")
    if r is None or "error" in r:
        reason = r["error"] if r else results.get("_missing", {}).get(key, "case not run")
        reason = reason.splitlines()[0]
        notes.setdefault(reason, []).append(f"{case} {dict(setup.columns)[key]}")
        return "n/a [%d]" % (list(notes).index(reason) + 1)
    v = r[metric]
    base = results.get(f"{case}/{setup.base}")
    if key == setup.base or base is None or "error" in base:
        return f"{v:.3f}"
    return f"{v:.3f} ({v / base[metric]:.2f}x)"


def table(setup, results, metric):
    notes = {}
    head = ["case"] + [h for _, h in setup.columns]
    rows = [[case] + [fmt(setup, results, case, key, metric, notes) for key, _ in setup.columns]
            for case in CASES]
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
    out = [line(head), "| " + " | ".join("-" * w for w in widths) + " |"]
    out += [line(r) for r in rows]
    if notes:
        out.append("")
    for i, (reason, where) in enumerate(notes.items(), 1):
        out.append(f"[{i}] {', '.join(where)}: {reason}")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("encore_bench", nargs="?",
                    default=os.path.join(ROOT, "build", "bench", "encore_bench"))
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cpu: the CPU cases against torch_peers.py and chainer_peers.py; cuda: "
                         "the /cuda cases against torch_cuda_peers.py (needs a GPU)")
    ap.add_argument("--cuda", dest="device", action="store_const", const="cuda",
                    help="the same as --device cuda")
    ap.add_argument("--repetitions", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=None,
                    help="seconds per repetition for every runner (default: each one's, 1 s)")
    ap.add_argument("--metric", choices=("real", "cpu", "both"), default="real",
                    help="real: wall time (encore_bench's Time column); cpu: the main "
                         "thread's CPU time (its CPU column), steadier on a busy machine")
    ap.add_argument("--torch-python", default=os.path.join(HERE, ".venv-torch", "bin", "python"))
    ap.add_argument("--chainer-python",
                    default=os.path.join(HERE, ".venv-chainer", "bin", "python"))
    ap.add_argument("--skip", action="append", default=[], choices=("encore", "torch", "chainer"))
    ap.add_argument("--encore-json",
                    help="take our results from this encore_bench JSON output (from "
                         "--benchmark_format=json or --benchmark_out) instead of running it")
    ap.add_argument("--json-out", help="also write all raw results to this file")
    args = ap.parse_args()
    setup = CUDA if args.device == "cuda" else CPU

    gpu_list = gpus() if setup is CUDA else None
    if setup is CUDA and gpu_list == [] and not args.encore_json:
        sys.exit("compare.py --cuda: no NVIDIA GPU visible (nvidia-smi lists none or cannot "
                 "reach the driver); the /cuda cases and torch_cuda_peers.py run only on a "
                 "machine with a GPU")
    if setup is CUDA and gpu_list is None:
        print("compare.py: no nvidia-smi; running anyway", file=sys.stderr)

    load_before = os.getloadavg()
    t0 = time.time()
    results, contexts, raw = {}, {}, {}
    missing = {}
    runners = [("encore", lambda: load_encore(args.encore_json) if args.encore_json else
                run_encore(setup, args.encore_bench, args.repetitions, args.min_time))]
    for fw, script, python_opt in setup.peers:
        runners.append((fw, lambda script=script, python_opt=python_opt: run_peer(
            script, getattr(args, python_opt), args.repetitions, args.min_time)))
    for fw, run in runners:
        keys = [k.split("/", 1)[1] for k, _ in setup.columns if k.startswith(fw + "/")]
        if fw in args.skip:
            err = "skipped (--skip)"
            got, ctx = {}, {}
        else:
            got, ctx, err = run()
        contexts[fw], raw[fw] = ctx, got
        for name, r in got.items():
            case, impl = name.split("/", 1)
            results[f"{case}/{fw}/{impl}"] = r
        for k in keys:
            missing[f"{fw}/{k}"] = err or ("encore_bench: not in this binary" if fw == "encore"
                                           else "case not run")
    results["_missing"] = missing

    print()
    print(f"Machine: {machine()}; {platform.system()} {platform.release()}")
    if gpu_list:
        print("GPU: " + "; ".join(gpu_list))
    print("Load average: before %s, after %s; took %.0f s" % (
        ", ".join(f"{x:.2f}" for x in load_before),
        ", ".join(f"{x:.2f}" for x in os.getloadavg()), time.time() - t0))
    vers = []
    for fw, _, _ in setup.peers:
        c = contexts.get(fw) or {}
        if c:
            vers.append(f"{fw} venv: python {c.get('python', '?')}, " + ", ".join(
                f"{k} {c[k]}" for k in (fw, "numpy", "cuda", "cudnn", "gpu") if k in c))
    enc = contexts.get("encore") or {}
    if enc:
        vers.append(f"encore_bench: {enc.get('openblas_config', '')}, "
                    f"openblas_threads={enc.get('openblas_threads', '?')}"
                    + (f", cuda: {enc['cuda']}" if "cuda" in enc else ""))
    print("Versions: " + "; ".join(vers))
    for fw, _, _ in setup.peers:
        for k, v in ((contexts.get(fw) or {}).get("notes") or {}).items():
            print(f"  {k}: {v}")
    for key, what in (("compile_s", "torch.compile compile + warm-up time"),
                      ("capture_s", "CUDA graph warm-up + capture time")):
        done = [f"{n.split('/')[0]} {r[key]:.1f}s" for n, r in (raw.get("torch") or {}).items()
                if key in r]
        if done:
            print(f"  {what} (excluded): " + ", ".join(done))
    if setup is CUDA:
        replays = [f"{n.split('/')[0]} {r['replay_ms']:.3f} ms" for n, r in
                   (raw.get("encore") or {}).items() if "replay_ms" in r]
        print("  kernel sum: KernelSum/<case>/cuda's kernel_us, the summed device time of the "
              "replayed step's kernels (in both metrics)"
              + (f"; its unprofiled replay: {', '.join(replays)}" if replays else ""))
    metrics = {"real": ["ms"], "cpu": ["cpu_ms"], "both": ["ms", "cpu_ms"]}[args.metric]
    base = dict(setup.columns)[setup.base]
    for m in metrics:
        what = "wall time" if m == "ms" else "main-thread CPU time"
        print(f"\nms per training step ({what}, median of {args.repetitions}); "
              f"(Nx) = this / {base}\n")
        print(table(setup, results, m))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"device": args.device, "contexts": contexts, "results": raw}, f, indent=1)


if __name__ == "__main__":
    main()
