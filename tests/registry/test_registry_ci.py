"""ci/: the per-target build script parses and rejects bad usage; the example workflow's matrix
covers arch x quant: CPU runners for cpu, TensorRT for RTX engines and the portable stages of
TensorRT 11's targets, GPU runners to finish those."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from llmc.compiler.config.build_config import FP8_TARGETS, GPU_TARGETS
from llmc.engine.targets import target_names

CI = Path(__file__).resolve().parents[2] / "ci"


def test_build_script_syntax_and_usage():
    script = CI / "build_engine.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    bad = subprocess.run(["bash", str(script), "engine"], capture_output=True, text=True)
    assert bad.returncode == 64 and "usage:" in bad.stderr
    cpu_stage = subprocess.run(
        ["bash", str(script), "stage", "m", "cpu", "none"], capture_output=True, text=True
    )
    assert cpu_stage.returncode == 64 and "for sm* targets" in cpu_stage.stderr


def test_workflow_matrix():
    flow = yaml.safe_load((CI / "workflows" / "build-engines.yml").read_text())
    jobs = flow["jobs"]
    assert jobs["cpu"]["strategy"]["matrix"]["quant"] == ["none", "int8", "int4"]
    assert "ci/build_engine.sh engine" in jobs["cpu"]["steps"][-1]["run"]
    archs = {"rtx": target_names("tensorrt-rtx"), "stage": target_names("tensorrt")}
    archs["gpu"] = archs["stage"]
    assert sorted(archs["rtx"] + archs["stage"]) == sorted(GPU_TARGETS)
    for name, wanted in archs.items():
        matrix = jobs[name]["strategy"]["matrix"]
        assert matrix["arch"] == list(wanted)
        excluded = {(e["arch"], e["quant"]) for e in matrix["exclude"]}
        no_fp8 = {(a, "fp8") for a in wanted if a not in FP8_TARGETS}
        assert excluded == no_fp8
    assert jobs["stage"]["runs-on"] == "ubuntu-24.04"  # the portable stage needs no GPU
    assert jobs["rtx"]["runs-on"] == "ubuntu-24.04"  # TensorRT for RTX builds on a CPU
    assert "tensorrt-rtx" in jobs["rtx"]["steps"][2]["run"]
    assert "ci/build_engine.sh engine" in jobs["rtx"]["steps"][-1]["run"]
    assert "gpu" in jobs["gpu"]["runs-on"] and jobs["gpu"]["needs"] == "stage"
    assert any("LLMC_STAGE" in step.get("run", "") for step in jobs["gpu"]["steps"])
