"""Calibration: run the unquantized engine graph over calibration windows and keep statistics
of the tensors quantization needs, cached on disk by a hash of (model, data, method).

The graph runs exactly as a CPU engine does (ORT segments + the paged-attention kernel), so the
statistics are of the very tensors the Q/DQ nodes will quantize, after every fusion pass.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from llmc.calibration.observers import TensorStats
from llmc.runtime.step_inputs import single_prefill

SAMPLE_ROWS = 512
CACHE_FORMAT = 2  # 2: optional Gram matrices


def calibration_key(**parts) -> str:
    """sha256 over the JSON of ``parts`` (model digest, data digest, method, tensor names...)."""
    blob = json.dumps({"format": CACHE_FORMAT, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def collect_stats(
    runner,
    tensors: dict[str, str],
    windows: list[np.ndarray],
    progress: Callable[[int, int], None] | None = None,
    sample_rows: int = SAMPLE_ROWS,
    seed: int = 0,
    gram_keys: frozenset[str] = frozenset(),
) -> dict[str, TensorStats]:
    """Statistics over ``windows`` (each [T] int64, prefilled as one sequence) of ``tensors``
    ({key: tensor name}), returned by key.

    ``runner`` is an ``OrtRunner.from_model(graph, ..., extra_outputs=<the tensor names>)`` with
    at least ``ceil(max T / block_size)`` blocks. Raises KeyError if the runner does not output
    a tensor. The keys in ``gram_keys`` also accumulate X^T X (``TensorStats.gram``).
    """
    rng = np.random.default_rng(seed)
    stats: dict[str, TensorStats] = {}
    for i, window in enumerate(windows):
        env = runner.run_step(single_prefill(window, runner.block_size, all_logits=True))
        for key, name in tensors.items():
            x = env[name]
            if key not in stats:
                stats[key] = TensorStats.empty(x.shape[-1], sample_rows, key in gram_keys)
            stats[key].update(x, rng, sample_rows)
        if progress is not None:
            progress(i + 1, len(windows))
    return stats


def save_stats(stats: dict[str, TensorStats], path: Path) -> None:
    """Write ``stats`` to ``path`` (.npz) atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {"names": np.array(json.dumps(list(stats)))}
    for i, s in enumerate(stats.values()):
        arrays[f"{i}.absmax"] = s.channel_absmax
        arrays[f"{i}.abssum"] = s.channel_abssum
        arrays[f"{i}.rows"] = np.array(s.rows)
        arrays[f"{i}.sample"] = s.sample
        if s.gram is not None:  # float32 on disk: half the size (1 GB -> 0.5 GB for Gemma 3
            arrays[f"{i}.gram"] = s.gram.astype(np.float32)  # 270M), ample for damped GPTQ
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)


def load_stats(path: Path) -> dict[str, TensorStats] | None:
    """Statistics saved by ``save_stats``, or None if ``path`` is missing or unreadable."""
    try:
        with np.load(path) as z:
            names = json.loads(str(z["names"]))
            return {
                n: TensorStats(
                    z[f"{i}.absmax"],
                    z[f"{i}.abssum"],
                    int(z[f"{i}.rows"]),
                    z[f"{i}.sample"],
                    z[f"{i}.gram"] if f"{i}.gram" in z else None,
                )
                for i, n in enumerate(names)
            }
    except (OSError, KeyError, ValueError):
        return None
