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


SPIKE_SCRIPT = """
import io, json, re
import numpy as np
import psutil
from llmc.compiler.stages.build_stats import BuildStats, high_water_mark
from llmc.compiler.stages.progress_lines import LineDisplay

out = io.StringIO()
stats = BuildStats(LineDisplay(out, False, heartbeat_s=60.0).stage, interval_s=10.0)
with stats.stage("spike"):
    base = psutil.Process().memory_info().rss
    spike = np.ones(%d, np.uint8)
    del spike
with stats.stage("after"):
    pass
shown = re.search(r"done: spike in [0-9.]+ s, peak RSS ([0-9.]+) GB", out.getvalue())
print(json.dumps({
    "mark": high_water_mark(), "base": base,
    "peaks": {k: v.peak_rss_bytes for k, v in stats.stages.items()},
    "shown": float(shown.group(1)) * 1e9 if shown else None,
}))
"""


def test_a_spike_between_samples_counts_in_the_stage_and_its_done_line():
    """An allocation made and freed between two samples (the sampler at 10 s) that raises the
    process's high-water mark is the stage's peak and its text done line's, not the next
    stage's. A fresh process, whose mark is its own (a test worker's is some earlier test's)."""
    import json

    run = subprocess.run(
        [sys.executable, "-c", SPIKE_SCRIPT % SPIKE_BYTES], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    if got["mark"] is None:
        pytest.skip("no /proc high-water mark here")
    spike, after = got["peaks"]["spike"], got["peaks"]["after"]
    assert spike >= got["base"] + 0.9 * SPIKE_BYTES
    assert after < spike - SPIKE_BYTES // 2
    assert got["shown"] is not None and got["shown"] >= got["base"] + 0.9 * SPIKE_BYTES
