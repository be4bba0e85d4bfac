"""A stage's peak RSS counts the build's child processes (TensorRT for RTX builds in one) and
what it allocated and freed between two samples."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llmc.compiler.stages.build_stats import BuildStats

CHILD_BYTES = 400 << 20
SPIKE_BYTES = 300 << 20


def test_a_stage_peak_includes_a_child_process():
    stats = BuildStats(interval_s=0.02)
    with stats.stage("alone"):
        pass
    child = (
        f"import numpy as np, sys, time; a = np.ones({CHILD_BYTES}, np.uint8); "
        "print('ready', flush=True); time.sleep(1.0)"
    )
    with stats.stage("with a child"):
        with subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE) as p:
            assert p.stdout.readline().strip() == b"ready"
            p.wait()
    added = stats.stages["with a child"].peak_rss_bytes - stats.stages["alone"].peak_rss_bytes
    assert added > CHILD_BYTES


def test_a_spike_between_samples_counts_in_the_stage_and_its_done_line():
    """An allocation made and freed between two samples (here, with the sampler at 10 s) is
    in the stage's peak and in the text display's done line (the process's high-water mark),
    and not in the next stage's."""
    import io
    import re

    import numpy as np
    import psutil

    from llmc.compiler.stages.build_stats import take_peak
    from llmc.compiler.stages.progress_lines import LineDisplay

    if take_peak() is None:
        pytest.skip("no /proc high-water mark here")
    out = io.StringIO()
    display = LineDisplay(out, False, heartbeat_s=60.0)
    stats = BuildStats(display.stage, interval_s=10.0)
    with stats.stage("spike"):
        base = psutil.Process().memory_info().rss
        spike = np.ones(SPIKE_BYTES, np.uint8)
        del spike
    with stats.stage("after"):
        pass
    peaks = {k: v.peak_rss_bytes for k, v in stats.stages.items()}
    assert peaks["spike"] >= base + 0.9 * SPIKE_BYTES
    assert peaks["after"] < peaks["spike"] - SPIKE_BYTES // 2
    shown = re.search(r"done: spike in [\d.]+ s, peak RSS ([\d.]+) GB", out.getvalue())
    assert shown and float(shown.group(1)) * 1e9 >= base + 0.9 * SPIKE_BYTES
