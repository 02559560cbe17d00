"""Timing harness shared by the peers scripts (standard library only).

Each case is a zero-argument `step()` that runs one training step. With `sync` (the GPU script:
torch.cuda.synchronize), sync() follows every step, so a step's time is the time to finish it
on the device, as in encore_bench's /cuda cases. The harness mimics
Google Benchmark's repetitions: it picks an iteration count so that one repetition lasts at
least `min_time` seconds, runs `repetitions` repetitions of that many steps, and reports the
median over repetitions of the wall time per step (and of the main thread's CPU time per step,
the `CPU` column of encore_bench, which is all the work of a step when everything runs on one
thread).
"""

import argparse
import contextlib
import json
import os
import platform
import re
import statistics
import sys
import time
import traceback

# The cases, in the order they are printed (encore_bench's: bench/mlp_step.h, bench/cnn_bench.cc,
# bench/sequence_step.h).
CASES = ("MlpSmall", "MlpLarge", "SeedCnn", "CharLstm", "TinyGpt", "LstmCellChain")


def single_thread_env():
    """Pins the BLAS and OpenMP pools to one thread; call before numpy/torch are imported."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


def parse_args(description, impls):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--filter", default="",
                   help="run only the cases whose name this regular expression matches (re.search: "
                        "'Mlp' runs MlpSmall and MlpLarge, 'CharLstm|TinyGpt' those two)")
    p.add_argument("--impl", choices=impls, action="append",
                   help="run only this implementation (may repeat; default: all)")
    p.add_argument("--repetitions", type=int, default=5)
    p.add_argument("--min-time", type=float, default=1.0,
                   help="seconds per repetition (as encore_bench's --benchmark_min_time)")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps before the timing")
    args = p.parse_args()
    if not args.impl:
        args.impl = list(impls)
    return args


def _synced(step, sync):
    if sync is None:
        return step

    def synced_step():
        step()
        sync()

    return synced_step


def _timed(step, n):
    w0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(n):
        step()
    return time.perf_counter() - w0, time.thread_time() - c0


def measure(step, *, repetitions, min_time, warmup, sync=None):
    """Median ms per step over `repetitions`; see the module docstring."""
    step = _synced(step, sync)
    for _ in range(warmup):
        step()
    # Calibrate as Google Benchmark does: grow n until one batch takes >= min_time / 10, then
    # scale it to min_time.
    n = 1
    while True:
        wall, _ = _timed(step, n)
        if wall >= min_time / 10 or n >= 1 << 20:
            break
        n *= 4 if wall < min_time / 100 else 2
    n = max(1, int(round(n * min_time / max(wall, 1e-9))))
    walls, cpus = [], []
    for _ in range(repetitions):
        wall, cpu = _timed(step, n)
        walls.append(wall * 1e3 / n)
        cpus.append(cpu * 1e3 / n)
    return {
        "ms": statistics.median(walls),
        "cpu_ms": statistics.median(cpus),
        "reps_ms": walls,
        "iterations": n,
        "repetitions": repetitions,
    }


def run_cases(framework, builders, args, versions, notes=None, sync=None, missing=None):
    """Runs builders[(case, impl)]() -> (step, extra) for the selected cases and prints them.

    `extra` is a dict merged into the result (e.g. the compile time). A builder or step that
    raises gives an entry with "error" instead of a time. `sync` goes to measure(). A case of
    CASES without builders (a peer that lacks it) gives an entry with "error" `missing` (the
    reason), without running anything.
    """
    results = []
    # In --json mode stdout carries the JSON alone: whatever the framework prints while it
    # runs (Chainer's static_graph prints "end of build_schedule()") goes to stderr.
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        for case in CASES:
            if args.filter and not re.search(args.filter, case):
                continue
            for impl in args.impl:
                if (case, impl) in builders:
                    entry = _run_one(builders[(case, impl)], case, impl, args, sync)
                else:
                    entry = {"name": f"{case}/{impl}", "case": case, "impl": impl,
                             "error": missing or f"no {framework} peer of {case}",
                             "not_ported": True}
                results.append(entry)
                if not args.json:
                    print_row(entry)
                    sys.stdout.flush()
    report = {
        "framework": framework,
        "context": {
            "python": platform.python_version(),
            **versions,
            "threads_env": {v: os.environ.get(v) for v in
                            ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")},
            "load_avg": list(os.getloadavg()),
            "repetitions": args.repetitions,
            "min_time_s": args.min_time,
            "notes": notes or {},
        },
        "benchmarks": results,
    }
    if args.json:
        print(json.dumps(report, indent=1))
    return report


def _run_one(build, case, impl, args, sync=None):
    entry = {"name": f"{case}/{impl}", "case": case, "impl": impl}
    try:
        step, extra = build()
        entry.update(extra)
        entry.update(measure(step, repetitions=args.repetitions, min_time=args.min_time,
                             warmup=args.warmup, sync=sync))
    except Exception as e:  # reported, not fatal: the table shows n/a and the reason
        entry["error"] = f"{type(e).__name__}: {e}".strip()
        entry["traceback"] = traceback.format_exc()
    return entry


def print_header(framework, versions):
    print(" ".join(f"{k} {v}" for k, v in [("python", platform.python_version()), *versions.items()]))
    print(f"Load Average: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'Benchmark':<28}{'Time':>14}{'CPU':>14}{'Iterations':>12}  (median of repetitions)")
    print("-" * 72)


def print_row(entry):
    if "error" in entry:
        first = entry["error"].splitlines()[0]
        if entry.get("not_ported"):
            print(f"{entry['name']:<28}  n/a: {first}")
        else:
            print(f"{entry['name']:<28}  ERROR OCCURRED: '{first}'")
        return
    extra = "".join(f"  {k}={entry[k]:.1f}" for k in ("compile_s", "capture_s") if k in entry)
    print(f"{entry['name']:<28}{entry['ms']:>11.3f} ms{entry['cpu_ms']:>11.3f} ms"
          f"{entry['iterations']:>12}{extra}")
