"""``llmc build --arch sm86|sm89|sm120`` on this CPU host: real TensorRT for RTX plans from
NVIDIA's parser and builder (no mock), one ``llmc::PagedAttention`` plugin record per layer in
each; the builder's refusals agree with llmc's lint; ``--from STAGE`` finishes a stage into a
plan; the runtime refuses the engine on a host without a GPU of its compute capability."""

from __future__ import annotations

import contextlib
import io
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from llmc.cli import main
from llmc.compiler.backends.tensorrt import lint
from llmc.compiler.backends.tensorrt.builder import PlanRequest, TensorRTBuildError
from llmc.compiler.backends.tensorrt.flavour import TENSORRT_RTX
from llmc.compiler.backends.tensorrt.rtx.plan_build import build_plan_rtx
from llmc.compiler.backends.tensorrt.rtx_backend import TensorRTRtxBackend
from llmc.engine import stage as st
from llmc.engine.gpu import GpuInfo
from llmc.engine.host import check_gpu_host
from llmc.engine.manifest import read_manifest
from llmc.engine.tensorrt_rtx import missing_for_build
from llmc.errors import EngineMismatchError
from tests.tiny_models import SHAKESPEARE, make_tiny_gemma3, make_tiny_llama

pytestmark = pytest.mark.skipif(
    bool(missing_for_build("sm89")), reason="TensorRT for RTX is not installed"
)

#: What each TensorRT for RTX target builds here: (arch, --quant, extra flags).
MATRIX = [
    ("sm86", "none", ["--dtype", "float16"]),
    ("sm86", "int8", []),
    ("sm86", "int4", ["--kv-cache-dtype", "int8"]),
    ("sm89", "none", []),
    ("sm89", "int8", []),
    ("sm89", "int4", []),
    ("sm89", "fp8", ["--kv-cache-dtype", "fp8"]),
    ("sm120", "none", []),
    ("sm120", "int8", []),
    ("sm120", "int4", []),
    ("sm120", "fp8", ["--kv-cache-dtype", "fp8"]),
    ("sm120", "nvfp4", []),
    ("sm120", "mxfp8", []),
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """(root, {family: checkpoint}, calibration text) shared by the builds."""
    root = tmp_path_factory.mktemp("rtx")
    data = root / "calib.txt"
    data.write_text(SHAKESPEARE.read_text()[:40_000])
    ckpts = {
        "gemma3": make_tiny_gemma3(root / "gemma3", seed=4),
        "llama": make_tiny_llama(root / "llama", seed=4),
    }
    return root, ckpts, data


def _build(inputs, family: str, arch: str, quant: str, flags: list[str], out: Path):
    """Run ``llmc build`` through the CLI; (exit code, stderr)."""
    root, ckpts, data = inputs
    args = ["build", str(ckpts[family]), "--arch", arch, "--quant", quant, "--block-size", "8"]
    args += ["--max-seq-len", "128", "--max-batch", "4", "--calib-data", str(data)]
    args += ["--calib-samples", "3", "--calib-seq-len", "32", "--cache-dir", str(root / "cache")]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main([*args, *flags, "-o", str(out)])
    return code, err.getvalue()


def plugin_layers(plan: bytes) -> list[int]:
    """The ``layer_idx`` of each PagedAttention plugin record serialized in ``plan``: the
    plugin's fields are stored by name, type name and value (an INT32 after 14 bytes)."""
    found = re.findall(rb"layer_idx.{1,64}?INT32.{14}(.{4})", plan, flags=re.DOTALL)
    return sorted(int.from_bytes(v, "little") for v in found)


@pytest.mark.parametrize("family", ["gemma3", "llama"])
@pytest.mark.parametrize(("arch", "quant", "flags"), MATRIX)
def test_build_writes_a_tensorrt_rtx_plan(inputs, tmp_path, family, arch, quant, flags):
    if family == "llama" and (arch, quant) not in {("sm86", "int8"), ("sm89", "fp8")}:
        pytest.skip("Llama: one build per target family is enough beside Gemma 3's matrix")
    lora = family == "llama" and arch == "sm89"  # LoRA slots: the same graph form as on cpu
    if lora:
        flags = [*flags, "--enable-lora", "--max-loras", "2", "--max-lora-rank", "4"]
    out = tmp_path / "engine"
    code, err = _build(inputs, family, arch, quant, flags, out)
    assert code == 0, err[-3000:]
    assert f"{arch}: backend tensorrt-rtx" in err
    m = read_manifest(out)
    record = m.tensorrt
    assert (m.backend, m.target, m.quant) == ("tensorrt-rtx", arch, quant)
    assert record["builder"] == "TensorRT-RTX" and record["built_on"] == "cpu"
    assert m.backend_version == record["version"] and record["version"].startswith("1.7.")
    assert record["compute_capability"] == f"{arch[2:-1]}.{arch[-1]}"
    plan = (out / record["plan"]).read_bytes()
    assert len(plan) > 100_000
    assert plugin_layers(plan) == list(range(m.num_layers))
    assert plan.count(b"llmc") >= m.num_layers  # the creator's namespace, per record
    if lora:  # the slot inputs are the plan's: the slot ids in its profile, A/B static
        assert (m.lora["max_loras"], m.lora["dtype"]) == (2, "bfloat16")
        assert len(m.lora["modules"]) == 7 * m.num_layers
        assert "lora_slot_ids" in record["profiles"][0]
        assert plan.count(b"lora_a.model.layers.") >= len(m.lora["modules"])


def _stage(inputs, out: Path, arch: str, quant: str) -> Path:
    """A tiny Gemma 3 stage, written as on a host without TensorRT for RTX (only the host's
    answer is replaced: the stage, lint and files are the real ones)."""
    absent = replace(TENSORRT_RTX, missing=lambda arch: ["TensorRT for RTX (absent here)"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TensorRTRtxBackend, "flavour", absent)
        code, err = _build(inputs, "gemma3", arch, quant, [], out)
    assert code == 2, err[-3000:]
    assert "portable stage written to" in err and "a host with TensorRT for RTX" in err
    assert f"llmc build --from {out} --arch {arch}" in err
    return out


@pytest.fixture(scope="module")
def fp8_stage(inputs, tmp_path_factory):
    """A tiny Gemma 3 sm89 fp8 stage."""
    return _stage(inputs, tmp_path_factory.mktemp("stage") / "stage", "sm89", "fp8")


@pytest.fixture(scope="module")
def nvfp4_stage(inputs, tmp_path_factory):
    """A tiny Gemma 3 sm120 nvfp4 stage."""
    return _stage(inputs, tmp_path_factory.mktemp("stage") / "stage", "sm120", "nvfp4")


def test_from_stage_builds_the_plan(fp8_stage, tmp_path):
    out = tmp_path / "engine"
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["build", "--from", str(fp8_stage), "--arch", "sm89", "-o", str(out)])
    assert code == 0, err.getvalue()[-3000:]
    m = read_manifest(out)
    assert (m.backend, m.target, m.quant) == ("tensorrt-rtx", "sm89", "fp8")
    assert plugin_layers((out / "engine.plan").read_bytes()) == list(range(m.num_layers))


@pytest.mark.parametrize(
    ("stage", "arch", "datatype", "lint_message"),
    [
        ("fp8_stage", "sm86", "fp8_e4m3", "FP8 needs sm89 or newer; target is sm86"),
        ("nvfp4_stage", "sm89", "fp4_e2m1", "FP4 needs sm100 or newer; target is sm89"),
    ],
)
def test_builder_refuses_what_the_lint_refuses(
    request, tmp_path, stage, arch, datatype, lint_message
):
    """A graph with a datatype the target's tensor cores lack: NVIDIA's builder refuses it, and
    so does llmc's lint (the rule whose source is that message), before any builder runs."""
    stage_dir = request.getfixturevalue(stage)
    m = st.read_stage(stage_dir)
    plan = PlanRequest(stage_dir / st.MODEL_FILE, tmp_path / "x.plan", _profile(m))
    refusal = (
        f"Cannot compile for target.s. {arch}, because the model contains HW-specific "
        f"datatypes: .*{datatype}"
    )
    with pytest.raises(TensorRTBuildError, match=refusal):
        build_plan_rtx(plan, arch)
    assert not (tmp_path / "x.plan").exists()
    report = lint.lint_file(stage_dir / st.MODEL_FILE, arch)
    assert lint_message in {f.message for f in report.errors}


def test_a_plan_for_a_target_it_does_not_build_is_refused(fp8_stage, tmp_path):
    m = st.read_stage(fp8_stage)
    request = PlanRequest(fp8_stage / st.MODEL_FILE, tmp_path / "x.plan", _profile(m))
    with pytest.raises(ValueError, match="not sm90"):
        build_plan_rtx(request, "sm90")


def _profile(m):
    from llmc.compiler.backends.tensorrt.builder import optimization_profile

    return optimization_profile(m.num_kv_heads, m.head_dim, m.num_layers, m.block_size, 64, 4, 64)


def test_runtime_refuses_the_engine_without_a_gpu_of_its_capability(inputs, tmp_path, capsys):
    out = tmp_path / "engine"
    code, err = _build(inputs, "gemma3", "sm89", "int8", [], out)
    assert code == 0, err[-3000:]
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "backend: tensorrt-rtx" in shown and "builder: TensorRT-RTX" in shown
    assert "built_on: cpu" in shown and "compute_capability: 8.9" in shown
    m = read_manifest(out)
    version = m.backend_version
    with pytest.raises(EngineMismatchError, match="compute capability 8.9; this host has no"):
        check_gpu_host(m, [], version)
    a100 = GpuInfo(0, "NVIDIA A100", (8, 0))
    with pytest.raises(EngineMismatchError, match=r"does not run on this host's GPUs.*sm80"):
        check_gpu_host(m, [a100], version)
    l4 = GpuInfo(0, "NVIDIA L4", (8, 9))
    with pytest.raises(EngineMismatchError, match="TensorRT for RTX is not installed"):
        check_gpu_host(m, [l4], None)
    assert check_gpu_host(m, [l4], version) == l4
    from llmc.runtime.runners.engine_loader import load_engine

    with pytest.raises(EngineMismatchError, match="no CUDA GPU"):
        load_engine(out)
    assert json.loads((out / "manifest.json").read_text())["backend"] == "tensorrt-rtx"
