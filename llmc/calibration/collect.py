"""Calibration: run the unquantized engine graph over calibration windows and keep statistics
of the tensors quantization needs (cached on disk by ``stats_cache``).

The graph runs exactly as a CPU engine does (ORT segments + the paged-attention kernel), so the
statistics are of the very tensors the Q/DQ nodes will quantize, after every fusion pass. A
build collects them one segment at a time (``collect_by_segment`` over a ``LayerwiseRunner``):
the statistics of a segment's tensors, GPTQ's Gram matrices included, are complete when that
segment has run over every window, and are quantized and dropped before the next segment runs.
``collect_stats`` runs one window through the whole graph at a time; both give the same
statistics (each tensor's reservoir sample draws from its own random stream, so the order in
which windows and tensors are visited does not matter).
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Callable, Iterator

import numpy as np

from llmc.calibration.observers import TensorStats
from llmc.runtime.runners.layerwise_runner import LayerwiseRunner
from llmc.runtime.runners.step_inputs import single_prefill

SAMPLE_ROWS = 512
CACHE_FORMAT = 3  # 2: optional Gram matrices; 3: one reservoir stream per tensor, per segment


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
    stats = _Accumulator(sample_rows, seed, gram_keys)
    for i, window in enumerate(windows):
        env = runner.run_step(single_prefill(window, runner.block_size, all_logits=True))
        for key, name in tensors.items():
            stats.update(key, env[name])
        if progress is not None:
            progress(i + 1, len(windows))
    return stats.done


def collect_by_segment(
    runner: LayerwiseRunner,
    tensors: dict[str, str],
    windows: list[np.ndarray],
    progress: Callable[[int, int], None] | None = None,
    sample_rows: int = SAMPLE_ROWS,
    seed: int = 0,
    gram_keys: frozenset[str] = frozenset(),
) -> Iterator[tuple[int, dict[str, TensorStats]]]:
    """Yield (segment index, statistics of the keys whose tensors that segment outputs) as each
    segment finishes running over every window; segments with no such tensor are skipped.
    Arguments as ``collect_stats``; ``runner`` is built with ``extra_outputs`` = the tensor
    names. Statistics equal ``collect_stats``'s. ``progress(done, total)`` counts segments."""
    keys_of: dict[str, list[str]] = {}
    for key, name in tensors.items():
        keys_of.setdefault(name, []).append(key)
    stats = _Accumulator(sample_rows, seed, gram_keys)
    for out in runner.run(windows, progress):
        for name, x in out.tensors.items():
            for key in keys_of.get(name, ()):
                stats.update(key, x)
        if out.window is None and stats.done:  # the segment ran every window, and is released
            finished, stats.done = stats.done, {}
            yield out.segment, finished
            del finished  # not held while the next segment runs


class _Accumulator:
    """``TensorStats`` by key, each key's reservoir sample drawn from its own random stream
    (seeded by ``seed`` and the key), so visiting order does not change the sample."""

    def __init__(self, sample_rows: int, seed: int, gram_keys: frozenset[str]):
        self.sample_rows, self.seed, self.gram_keys = sample_rows, seed, gram_keys
        self.done: dict[str, TensorStats] = {}
        self._rngs: dict[str, np.random.Generator] = {}

    def update(self, key: str, x: np.ndarray) -> None:
        if key not in self.done:
            self.done[key] = TensorStats.empty(x.shape[-1], self.sample_rows, key in self.gram_keys)
            self._rngs[key] = np.random.default_rng([self.seed, zlib.crc32(key.encode())])
        self.done[key].update(x, self._rngs[key], self.sample_rows)
