"""Build progress off a terminal (a CI log): a line when each stage starts and ends with its
wall time and peak RSS, throttled sub-step lines, a heartbeat naming the running stage when a
stage is silent, JSON lines with ``--log-format json``; the real CLI prints them into a pipe,
and the engine it builds loads without a warning from ONNX Runtime."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time

import pytest

from llmc.compiler.stages.progress import BuildProgress
from tests.tiny_models import make_tiny_llama


def _lines(stream: io.StringIO) -> list[str]:
    return [line for line in stream.getvalue().splitlines() if line]


def test_text_lines_name_each_stage_its_wall_time_and_peak_rss():
    out = io.StringIO()  # not a terminal: "auto" prints lines
    with BuildProgress(stream=out) as progress:
        with progress.stage("load weights") as tick:
            for i in range(1, 101):
                tick(i, 100)
    lines = _lines(out)
    assert "start: load weights" in lines[0]
    assert lines[-1].split("] ", 1)[1].startswith("done: load weights in ")
    assert "peak RSS" in lines[-1] and lines[-1].endswith(" GB")
    progress_lines = [line for line in lines if "load weights: " in line]
    # throttled to one per 10 s, and the last step always shown
    assert [line.split("load weights: ")[1].split(" ")[0] for line in progress_lines] == [
        "1/100",
        "100/100",
    ]


def test_a_silent_stage_gets_heartbeats_and_json_lines_parse():
    out = io.StringIO()
    with BuildProgress("json", stream=out, heartbeat_s=0.2) as progress:
        with progress.stage("calibrate"):
            time.sleep(1.0)
    records = [json.loads(line) for line in _lines(out)]
    events = [r["event"] for r in records]
    assert events[0] == "start" and events[-1] == "done"
    assert events.count("heartbeat") >= 2
    assert all(r["stage"] == "calibrate" and r["rss_gb"] > 0 for r in records)
    done = records[-1]
    assert done["wall_s"] >= 1.0 and done["peak_rss_gb"] >= records[0]["rss_gb"]


def test_an_unknown_log_format_is_refused():
    with pytest.raises(ValueError, match="auto, text, json"):
        BuildProgress("xml")


def test_the_cli_prints_stage_lines_into_a_pipe(tmp_path):
    ckpt = make_tiny_llama(tmp_path / "ckpt", seed=2)
    cmd = [sys.executable, "-m", "llmc.cli", "build", str(ckpt), "--block-size", "8"]
    cmd += ["--max-seq-len", "64", "--execution-provider", "cpu", "-o", str(tmp_path / "e")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("[")]
    starts = [line for line in lines if "] start: " in line]
    ends = [line for line in lines if "] done: " in line]
    assert len(starts) == len(ends) >= 5
    assert any("export to ONNX" in line for line in ends)
    assert all("peak RSS" in line for line in ends)
    # A clean engine: no initializer that no node reads, so ONNX Runtime has nothing to warn of.
    import onnx

    engine = onnx.load(str(tmp_path / "e" / "engine.onnx"), load_external_data=False)
    read = {name for node in engine.graph.node for name in node.input}
    assert {t.name for t in engine.graph.initializer} <= read
    cmd = [sys.executable, "-m", "llmc.cli", "generate", str(tmp_path / "e"), "Hello"]
    run = subprocess.run([*cmd, "--max-tokens", "3"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "onnxruntime" not in run.stderr, run.stderr[-2000:]
