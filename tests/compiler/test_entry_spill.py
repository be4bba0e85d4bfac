"""A float run's segment entries kept on disk: the same tensors, memory-mapped, small ones in
memory; pages given back and read again."""

from __future__ import annotations

import tempfile

import numpy as np

from llmc.compiler.quantize.search.entry_spill import drop_entry_pages, spill_entries
from llmc.runtime.runners.layerwise_runner import SegmentEntry


def test_spilled_entries_are_the_same_tensors_mapped_from_the_file():
    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(2, 256, 640)).astype(np.float32)  # 1.3 MB: spilled
    positions = np.arange(256, dtype=np.int64)[None]  # 2 KB: stays in memory
    strided = rng.normal(size=(64, 1024)).astype(np.float32)[:, ::2]  # not contiguous
    entries = {1: SegmentEntry(1, [{"h": hidden, "pos": positions, "s": strided}] * 2), 2: None}
    with tempfile.TemporaryFile() as file:
        spilled = spill_entries(entries, file)
        assert spilled[2] is None and spilled[1].segment == 1
        for env in spilled[1].envs:
            assert isinstance(env["h"], np.memmap) and not env["h"].flags.writeable
            assert isinstance(env["s"], np.memmap)
            assert env["pos"] is positions
            np.testing.assert_array_equal(env["h"], hidden)
            np.testing.assert_array_equal(env["s"], strided)
        drop_entry_pages(spilled)  # read from the file again when used
        np.testing.assert_array_equal(spilled[1].envs[1]["h"], hidden)
        assert spilled[1].envs[0]["h"].dtype == np.float32 and spilled[1].envs[0]["h"].shape == (
            2,
            256,
            640,
        )
