"""Calibration statistics on disk: one ``.npz`` of ``TensorStats`` per file, and the cache of a
build's statistics as one file per calibrated segment.

The cache directory of a calibration key (``calibration_key``: model, data, method, tensors,
llmc version) holds ``segment_NNN.npz`` for each segment that outputs calibrated tensors and a
``complete`` marker written after the last, so an interrupted calibration is redone, and a
build that finds it complete reads one segment's statistics at a time (GPTQ's Gram matrices
of a 1B-class model are gigabytes in all, tens of megabytes per segment).

The cache is a convenience and may not take the disk a build needs: Gram matrices grow with
the square of a layer's width (a Llama-3.2-3B-shaped model's are 0.42 GB per layer, 12 GB in
all; a Llama-3.1-8B one's would be about 1 GB per layer, 33 GB in all). A segment is saved
only while the disk keeps the build's reserve free after it (``build_reserve``: room for the
quantized weights and the engine still to be written, at most twice the float weights, and
1 GiB; ``MIN_FREE_BYTES`` or a tenth of a smaller disk when no build names one); past that the
cache stops, deletes what it wrote, and the build goes on without it (``StatsCache.skipped``
says why).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np

from llmc.calibration.observers import TensorStats

_COMPLETE = "complete"
#: Disk space (bytes) a cache write must leave free, at most a tenth of the disk: the build's
#: own files (its float graph, quantized weights and engine: several GB at billions of
#: parameters) come first.
MIN_FREE_BYTES = 10 << 30
#: What a build's reserve adds to its files still to be written: its reports, logs and the
#: provider probe's scratch.
RESERVE_MARGIN_BYTES = 1 << 30


def build_reserve(float_weight_bytes: int) -> int:
    """The disk space (bytes) a build of a float graph with ``float_weight_bytes`` of weights
    keeps free from its statistics cache: its quantized weights and its engine, each at most
    the float weights' bytes, and ``RESERVE_MARGIN_BYTES``."""
    return 2 * float_weight_bytes + RESERVE_MARGIN_BYTES


class StatsCache:
    """The statistics of one calibration key, under directory ``root``; a save that would leave
    under ``min_free_bytes`` free on its disk (default: ``MIN_FREE_BYTES`` or a tenth of the
    disk, the smaller) stops the cache (see the module docstring)."""

    def __init__(self, root: Path, min_free_bytes: int | None = None):
        self.root = Path(root)
        self.min_free_bytes = min_free_bytes
        self.skipped: str | None = None

    def _segment_path(self, segment: int) -> Path:
        return self.root / f"segment_{segment:03d}.npz"

    def is_complete(self) -> bool:
        """Every segment's statistics were written (``mark_complete``)."""
        return (self.root / _COMPLETE).is_file()

    def save(self, segment: int, stats: dict[str, TensorStats]) -> bool:
        """Write one segment's statistics (atomically); returns False, writing nothing, once the
        cache has stopped: this save would leave under its reserve free on the disk (what was
        saved before is deleted then, and ``skipped`` says why)."""
        if self.skipped is not None:
            return False
        self.root.mkdir(parents=True, exist_ok=True)
        need = stats_bytes(stats)
        disk = shutil.disk_usage(self.root)
        reserve = self.min_free_bytes
        if reserve is None:
            reserve = min(MIN_FREE_BYTES, disk.total // 10)
        if disk.free - need < reserve:
            self.skipped = (
                f"calibration statistics not cached: segment {segment}'s {need / 1e9:.2f} GB "
                f"would leave {(disk.free - need) / 1e9:.1f} GB free under {self.root}, under "
                f"the {reserve / 1e9:.1f} GB a build keeps for its own files"
            )
            shutil.rmtree(self.root, ignore_errors=True)
            return False
        save_stats(stats, self._segment_path(segment))
        return True

    def mark_complete(self) -> None:
        """Record that every segment was saved (nothing once the cache has stopped)."""
        if self.skipped is None:
            (self.root / _COMPLETE).write_text("")

    def segments(self) -> Iterator[tuple[int, dict[str, TensorStats]]]:
        """(segment, statistics) of a complete cache, read one file at a time. Raises
        ValueError if a file cannot be read (the cache is damaged: delete ``root``)."""
        for path in sorted(self.root.glob("segment_*.npz")):
            stats = load_stats(path)
            if stats is None:
                raise ValueError(f"damaged calibration cache file {path}; delete {self.root}")
            yield int(path.stem.split("_")[1]), stats
            del stats  # not held while the next file is read

    def load_all(self, gram: bool = False) -> dict[str, TensorStats] | None:
        """Every key's statistics (without Gram matrices unless ``gram``), or None when the
        cache is not complete or damaged."""
        if not self.is_complete():
            return None
        out: dict[str, TensorStats] = {}
        try:
            for _, stats in self.segments():
                out.update(stats if gram else {k: replace(s, gram=None) for k, s in stats.items()})
        except ValueError:
            return None
        return out


def stats_bytes(stats: dict[str, TensorStats]) -> int:
    """About the bytes ``save_stats`` writes for ``stats`` (Gram matrices as float32)."""
    total = 0
    for s in stats.values():
        total += s.channel_absmax.nbytes + s.channel_abssum.nbytes + s.sample.nbytes
        if s.gram is not None:
            total += 4 * s.gram.size
    return total


def as_stored(stats: dict[str, TensorStats]) -> dict[str, TensorStats]:
    """``stats`` as ``save_stats`` stores them (Gram matrices rounded to float32), so that a
    build that calibrates quantizes from the very numbers a build reading the cache gets: GPTQ
    from a float64 Gram matrix rounds a weight now and then to the other grid point."""
    return {
        k: s if s.gram is None else replace(s, gram=s.gram.astype(np.float32))
        for k, s in stats.items()
    }


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
