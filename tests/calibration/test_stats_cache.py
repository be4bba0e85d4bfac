"""The calibration statistics cache: saved and read back one segment at a time, and stopped
(deleting what it wrote) when a save would leave the disk under its reserve."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from llmc.calibration.observers import TensorStats
from llmc.calibration.stats_cache import (
    RESERVE_MARGIN_BYTES,
    StatsCache,
    build_reserve,
    stats_bytes,
)


def _stats(seed: int, channels: int = 16) -> dict[str, TensorStats]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((32, channels)).astype(np.float32)
    stats = TensorStats(
        np.abs(x).max(0), np.abs(x).sum(0, dtype=np.float64), 32, x[:8].copy(),
        x.T.astype(np.float64) @ x,
    )  # fmt: skip
    return {f"layer{seed}.input": stats}


def test_segments_read_back_equal_what_was_saved(tmp_path):
    cache = StatsCache(tmp_path / "key", min_free_bytes=0)
    saved = {0: _stats(0), 2: _stats(2)}
    for segment, stats in saved.items():
        assert cache.save(segment, stats)
    assert not cache.is_complete()
    cache.mark_complete()
    got = dict(cache.segments())
    assert sorted(got) == [0, 2]
    for segment, stats in saved.items():
        (name,) = stats
        a, b = stats[name], got[segment][name]
        np.testing.assert_array_equal(a.channel_absmax, b.channel_absmax)
        np.testing.assert_array_equal(a.sample, b.sample)
        assert a.rows == b.rows
        np.testing.assert_allclose(a.gram, b.gram, rtol=1e-6)  # float32 on disk
    assert cache.skipped is None


def test_a_save_that_would_leave_too_little_disk_stops_the_cache_and_deletes_it(tmp_path):
    cache = StatsCache(tmp_path / "key", min_free_bytes=0)
    assert cache.save(0, _stats(0))
    assert (tmp_path / "key").is_dir()
    cache.min_free_bytes = 1 << 62  # more than any disk has
    assert not cache.save(1, _stats(1))
    assert not (tmp_path / "key").exists()  # segment 0 deleted too: no partial cache is left
    assert "segment 1" in cache.skipped and "GB" in cache.skipped
    assert not cache.save(2, _stats(2))  # stopped for good
    cache.mark_complete()
    assert not cache.is_complete() and cache.load_all() is None


def test_stats_bytes_is_what_lands_on_disk(tmp_path):
    cache = StatsCache(tmp_path / "key", min_free_bytes=0)
    stats = _stats(0, channels=256)
    cache.save(0, stats)
    on_disk = sum(p.stat().st_size for p in (tmp_path / "key").iterdir())
    assert 0.9 * on_disk <= stats_bytes(stats) <= on_disk


def test_a_builds_reserve_follows_its_weights_not_the_disk(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    if free < RESERVE_MARGIN_BYTES + (64 << 20):
        pytest.skip("under the reserve margin free on this disk")
    # A tiny model's build caches with a few GB free: it keeps room for its own few MB.
    assert StatsCache(tmp_path / "tiny", build_reserve(4 << 20)).save(0, _stats(0))
    # A build whose quantized weights and engine would not fit beside the cache does not cache.
    large = StatsCache(tmp_path / "large", build_reserve(free // 2))
    assert not large.save(0, _stats(0))
    assert "GB" in large.skipped
