"""``llmc.heap``: freed memory leaves the resident set, on this host's real glibc.

The case runs in a fresh interpreter (glibc's mmap threshold is per process): it frees a mapped
16 MiB block (glibc then raises its mmap threshold, so 1 MiB arrays come from the heap), makes
300 arrays of 1 MiB and one more that pins the top of the heap, frees the 300 and reads the
resident set before, after the free, and after ``release_freed_memory``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")

PROGRAM = """
import numpy as np, psutil
from llmc.heap import release_freed_memory
rss = lambda: psutil.Process().memory_info().rss / 2**20
big = np.ones(16 << 20, np.uint8); del big
blocks = [np.ones(1 << 20, np.uint8) for _ in range(300)]
pin = np.ones(1 << 20, np.uint8)
before = rss(); del blocks; freed = rss(); release_freed_memory(); trimmed = rss()
print(before, freed, trimmed)
"""


def resident_mib() -> tuple[float, float, float]:
    """(before the free, after it, after release_freed_memory), MiB."""
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=True
    )
    before, freed, trimmed = map(float, out.stdout.split())
    return before, freed, trimmed


def test_release_returns_freed_heap_pages():
    before, freed, trimmed = resident_mib()
    assert freed > before - 100  # glibc kept the 300 MiB it took from the heap
    assert trimmed < before - 250  # malloc_trim gave it back
