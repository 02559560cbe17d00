"""Runs the ONNX models check.cc exported with onnxruntime and compares them with encore.

The manifest lists, per model, runs at a batch size with their input and output .npy files.
Every element of every output must satisfy

    |onnx - encore| <= 1e-5 * (max(|onnx|, |encore|) + 0.1 * max |encore over the output|)

a relative error of 1e-5, with an absolute floor of 1e-6 of the output's largest magnitude for
elements near zero (float32 sums computed in another order differ by a few ulps of their terms,
which is a large relative error in a logit that cancels to almost nothing). Prints the largest
such error per model and batch size; exits 1 when one is over.
"""
import sys

import numpy as np
import onnxruntime as ort

TOLERANCE = 1e-5
FLOOR = 0.1


def relative_error(got, want):
    """max |got - want| / (max(|got|, |want|) + FLOOR * max |want|) over the elements."""
    if got.size == 0:
        return 0.0
    got = got.astype(np.float64)
    want = want.astype(np.float64)
    floor = FLOOR * float(np.max(np.abs(want)))
    scale = np.maximum(np.abs(got), np.abs(want)) + floor
    return float(np.max(np.abs(got - want) / np.maximum(scale, np.finfo(np.float64).tiny)))


def main(manifest):
    models = []
    for line in open(manifest):
        kind, *rest = line.split()
        if kind == "model":
            models.append({"name": rest[0], "path": rest[1], "runs": []})
        elif kind == "run":
            models[-1]["runs"].append({"batch": int(rest[0]), "inputs": {}, "outputs": []})
        elif kind == "input":
            models[-1]["runs"][-1]["inputs"][rest[0]] = np.load(rest[1])
        elif kind == "output":
            models[-1]["runs"][-1]["outputs"].append(np.load(rest[0]))
    failed = False
    for m in models:
        session = ort.InferenceSession(m["path"], providers=["CPUExecutionProvider"])
        for run in m["runs"]:
            got = session.run(None, run["inputs"])
            if len(got) != len(run["outputs"]):
                print(f"{m['name']} batch {run['batch']}: {len(got)} outputs, encore has "
                      f"{len(run['outputs'])}")
                failed = True
                continue
            worst = 0.0
            for g, w in zip(got, run["outputs"]):
                if g.shape != w.shape:
                    print(f"{m['name']} batch {run['batch']}: shape {g.shape}, encore {w.shape}")
                    failed = True
                    worst = float("inf")
                    continue
                worst = max(worst, relative_error(g, w))
            ok = worst <= TOLERANCE
            failed |= not ok
            print(f"{m['name']:16s} batch {run['batch']}: max relative error {worst:.3e} "
                  f"{'ok' if ok else 'OVER ' + str(TOLERANCE)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
