"""Reads an encore checkpoint with the safetensors package and writes it again with it.

    python3 roundtrip.py IN OUT

Checks what a PyTorch user sees (dtypes, shapes, metadata), then saves every tensor and the
metadata through safetensors.numpy, whose layout (order, padding) is its own, for encore to load.
"""
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

source, target = sys.argv[1], sys.argv[2]
tensors = {}
with safe_open(source, framework="np") as f:
    metadata = f.metadata()
    for name in f.keys():
        tensors[name] = f.get_tensor(name)

assert metadata["format"] == "encore.checkpoint", metadata
assert metadata["optimizer.kind"] == "Adam", metadata
assert tensors["0.weight"].dtype == np.float32 and tensors["0.weight"].shape == (4, 3)
assert tensors["optimizer.0.t"].dtype == np.int64 and tensors["optimizer.0.t"].shape == ()
assert int(tensors["optimizer.0.t"]) == 2, tensors["optimizer.0.t"]
assert np.all(np.isfinite(tensors["optimizer.0.v"])) and np.all(tensors["optimizer.0.v"] >= 0)
save_file(tensors, target, metadata=metadata)
print(f"roundtrip: {len(tensors)} tensors, {len(metadata)} metadata entries")
