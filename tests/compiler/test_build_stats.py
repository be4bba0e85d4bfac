"""A stage's peak RSS counts the build's child processes (TensorRT for RTX builds in one)."""

from __future__ import annotations

import subprocess
import sys

from llmc.compiler.stages.build_stats import BuildStats

CHILD_BYTES = 400 << 20


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
