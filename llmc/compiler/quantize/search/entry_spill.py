"""A float run's segment entries (``SegmentEntry``: per window, the tensors live where a segment
starts) kept in a temporary file and memory-mapped, so the search holds them on disk, not in
memory.

A resumable window set keeps an entry per segment for the search's scorings to start from (the
first segment an assignment quantizes): for Gemma 3 270M's sensitivity set (4 windows x 256
tokens) 18 entries of ~20 MB, 0.37 GB of C heap held through the search. A scoring reads one
entry; ``drop_pages`` gives its pages back afterwards (a mapped file's pages count in the
process's resident memory once read).
"""

from __future__ import annotations

from typing import BinaryIO

import numpy as np

from llmc.compiler.quantize.tensor_spill import SPILL_THRESHOLD_BYTES, drop_pages
from llmc.runtime.runners.layerwise_runner import SegmentEntry

Entries = dict[int, SegmentEntry | None]


def spill_entries(entries: Entries, file: BinaryIO) -> Entries:
    """``entries`` with each tensor of ``SPILL_THRESHOLD_BYTES`` or more appended to ``file``
    (opened for reading and writing) and memory-mapped from it read-only: the same dtypes,
    shapes and values. Raises OSError when the file cannot be written."""
    out: Entries = {}
    for index, entry in entries.items():
        if entry is None:
            out[index] = None
            continue
        envs = [{name: _spilled(a, file) for name, a in env.items()} for env in entry.envs]
        out[index] = SegmentEntry(entry.segment, envs)
    return out


def _spilled(array: np.ndarray, file: BinaryIO) -> np.ndarray:
    if array.nbytes < SPILL_THRESHOLD_BYTES:
        return array
    contiguous = np.ascontiguousarray(array)
    file.seek(0, 2)
    offset = file.tell()
    file.write(contiguous.tobytes())
    file.flush()  # mapped at once: the bytes must be in the file, not in its buffer
    return np.memmap(file, contiguous.dtype, "r", offset=offset, shape=contiguous.shape)


def drop_entry_pages(entries: Entries) -> None:
    """Give back the resident pages of every spilled tensor of ``entries``."""
    for entry in entries.values():
        if entry is not None:
            for env in entry.envs:
                for array in env.values():
                    drop_pages(array)
