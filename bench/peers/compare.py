#!/usr/bin/env python3
"""Runs encore_bench and the peer scripts one after the other and prints one table.

    python3 bench/peers/compare.py [build/bench/encore_bench] [--metric real|cpu|both]

Standard library only; the peers run in their own venvs (bench/peers/.venv-torch,
bench/peers/.venv-chainer, see README.md). A peer whose venv is missing, a case that our
binary does not have, or a case that fails shows as n/a, with the reason under the table.
Everything runs single-threaded (OPENBLAS_NUM_THREADS=1, ENCORE_NUM_THREADS=1, OMP_NUM_THREADS=1,
MKL_NUM_THREADS=1,
torch.set_num_threads(1)). Each cell is the median over the repetitions of ms per training
step; the ratio in brackets is that cell over `encore static` (above 1: slower than encore
static).
"""

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CASES = ("MlpSmall", "MlpLarge", "SeedCnn")
# (column key, header), in table order.
COLUMNS = (
    ("encore/eager", "encore eager"),
    ("encore/static", "encore static"),
    ("torch/torch_eager", "torch eager"),
    ("torch/torch_compile", "torch.compile"),
    ("chainer/chainer_eager", "chainer eager"),
    ("chainer/chainer_static", "chainer static_graph"),
)
BASE = "encore/static"
# Google Benchmark appends /real_time to a UseRealTime() case's name for --benchmark_filter
# (main.cc strips it from the reported names only), so the filter allows a suffix.
ENCORE_FILTER = r"^(MlpSmall|MlpLarge|SeedCnn)/(eager|static)(/|$)"
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


def parse_encore(data):
    """{"MlpSmall/eager": {"ms":..., "cpu_ms":...} or {"error":...}} from encore_bench's JSON."""
    out = {}
    for b in data.get("benchmarks", []):
        name = b.get("run_name", b["name"])
        name = re.sub(r"/(real_time|manual_time|min_time:[^/]*)", "", name)
        if b.get("error_occurred"):
            out[name] = {"error": b.get("error_message", "error")}
            continue
        if b.get("aggregate_name") not in ("median", None):
            continue
        scale = TO_MS[b.get("time_unit", "ns")]
        out[name] = {"ms": b["real_time"] * scale, "cpu_ms": b["cpu_time"] * scale}
    return out


def run_encore(binary, repetitions, min_time):
    """The medians of our cases, the context, and an error for the whole run (or None).

    If the run as a whole fails (a crash in one case loses the JSON of all), each case runs
    alone, so that only the failing ones show as n/a.
    """
    if not os.path.exists(binary):
        return {}, {}, f"{binary} not found (build it: make -C build encore_bench)"
    data, err = _run_json(_encore_cmd(binary, ENCORE_FILTER, repetitions, min_time))
    if data is not None:
        return parse_encore(data), data.get("context", {}), None
    print(f"encore_bench {err}; running its cases one by one", file=sys.stderr)
    out, context = {}, {}
    for case in CASES:
        for impl in ("eager", "static"):
            d, e = _run_json(_encore_cmd(binary, f"^{case}/{impl}(/|$)", repetitions, min_time))
            if d is None:
                if "Failed to match any benchmarks" in e:
                    e = "not in this binary"
                out[f"{case}/{impl}"] = {"error": f"encore_bench: {e}"}
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
    if not os.path.exists(python):
        return {}, {}, f"not installed ({os.path.relpath(python, ROOT)} missing; see README.md)"
    cmd = [python, os.path.join(HERE, script), "--json", f"--repetitions={repetitions}"]
    if min_time is not None:
        cmd.append(f"--min-time={min_time}")
    print("+ " + " ".join(cmd), file=sys.stderr)
    p = subprocess.run(cmd, env=env(), capture_output=True, text=True)
    try:
        data = json.loads(p.stdout)
    except json.JSONDecodeError:
        tail = (p.stderr.strip() or f"exit {p.returncode}").splitlines()[-1]
        return {}, {}, f"{script}: {tail}"
    return {b["name"]: b for b in data["benchmarks"]}, data["context"], None


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


def fmt(results, case, key, metric, notes):
    r = results.get(f"{case}/{key}")
    if r is None or "error" in r:
        reason = r["error"] if r else results.get("_missing", {}).get(key, "case not run")
        reason = reason.splitlines()[0]
        notes.setdefault(reason, []).append(f"{case} {dict(COLUMNS)[key]}")
        return "n/a [%d]" % (list(notes).index(reason) + 1)
    v = r[metric]
    base = results.get(f"{case}/{BASE}")
    if key == BASE or base is None or "error" in base:
        return f"{v:.3f}"
    return f"{v:.3f} ({v / base[metric]:.2f}x)"


def table(results, metric):
    notes = {}
    head = ["case"] + [h for _, h in COLUMNS]
    rows = [[case] + [fmt(results, case, key, metric, notes) for key, _ in COLUMNS]
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

    load_before = os.getloadavg()
    t0 = time.time()
    results, contexts, raw = {}, {}, {}
    missing = {}
    runners = [
        ("encore", lambda: load_encore(args.encore_json) if args.encore_json else
         run_encore(args.encore_bench, args.repetitions, args.min_time)),
        ("torch", lambda: run_peer("torch_peers.py", args.torch_python, args.repetitions,
                                   args.min_time)),
        ("chainer", lambda: run_peer("chainer_peers.py", args.chainer_python, args.repetitions,
                                     args.min_time)),
    ]
    for fw, run in runners:
        keys = [k.split("/", 1)[1] for k, _ in COLUMNS if k.startswith(fw + "/")]
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
    print("Load average: before %s, after %s; took %.0f s" % (
        ", ".join(f"{x:.2f}" for x in load_before),
        ", ".join(f"{x:.2f}" for x in os.getloadavg()), time.time() - t0))
    vers = []
    for fw in ("torch", "chainer"):
        c = contexts.get(fw) or {}
        if c:
            vers.append(f"{fw} venv: python {c.get('python', '?')}, " + ", ".join(
                f"{k} {c[k]}" for k in (fw, "numpy") if k in c))
    enc = contexts.get("encore") or {}
    if enc:
        vers.append(f"encore_bench: {enc.get('openblas_config', '')}, "
                    f"openblas_threads={enc.get('openblas_threads', '?')}")
    print("Versions: " + "; ".join(vers))
    for fw in ("torch", "chainer"):
        for k, v in ((contexts.get(fw) or {}).get("notes") or {}).items():
            print(f"  {k}: {v}")
    compiles = [f"{n.split('/')[0]} {r['compile_s']:.1f}s" for n, r in
                (raw.get("torch") or {}).items() if "compile_s" in r]
    if compiles:
        print("  torch.compile compile + warm-up time (excluded): " + ", ".join(compiles))
    metrics = {"real": ["ms"], "cpu": ["cpu_ms"], "both": ["ms", "cpu_ms"]}[args.metric]
    for m in metrics:
        what = "wall time" if m == "ms" else "main-thread CPU time"
        print(f"\nms per training step ({what}, median of {args.repetitions}); "
              f"(Nx) = this / encore static\n")
        print(table(results, m))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"contexts": contexts, "results": raw}, f, indent=1)


if __name__ == "__main__":
    main()
