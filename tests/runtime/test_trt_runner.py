"""What of the TensorRT runtime and builder runs without TensorRT: the host check before any plan
is read or ``tensorrt`` imported, the optimization profile, the progress monitor's logic, and the
manifest's TensorRT record."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, replace

import pytest

from llmc.compiler.backends.tensorrt.builder import BuildPhases, ShapeRange, optimization_profile
from llmc.engine.gpu import GpuInfo, arch_capability
from llmc.engine.host import check_gpu_host
from llmc.engine.manifest import EngineManifest, read_manifest, write_manifest
from llmc.errors import EngineMismatchError
from tests.manifests import make_manifest

H100 = GpuInfo(0, "NVIDIA H100", (9, 0))
A100 = GpuInfo(0, "NVIDIA A100", (8, 0))
L40S = GpuInfo(1, "NVIDIA L40S", (8, 9))


def _manifest(compat: str = "none", version: str = "11.2.1") -> EngineManifest:
    return make_manifest(
        "sm90",
        "tensorrt",
        dtype="bfloat16",
        quant="int8",
        kv_cache_dtype="bfloat16",
        backend_version=version,
        execution_provider="TensorRT",
        execution_precision="bf16",
        tensorrt={"version": version, "plan": "engine.plan", "hardware_compatibility": compat},
    )


def test_host_check_picks_a_matching_gpu_or_says_what_is_wrong():
    m = _manifest()
    assert check_gpu_host(m, [A100, L40S, GpuInfo(2, "H100 #2", (9, 0))], "11.2.1.5").index == 2
    with pytest.raises(EngineMismatchError, match=r"no CUDA GPU.*--arch cpu"):
        check_gpu_host(m, [], "11.2.1")
    with pytest.raises(EngineMismatchError) as e:
        check_gpu_host(m, [A100], "11.2.1")
    assert "NVIDIA A100 (sm80)" in str(e.value) and "--arch sm80" in str(e.value)
    assert "ampere+" not in str(e.value)  # the AOT kernel runs on its own architecture only
    assert check_gpu_host(_manifest("ampere+"), [A100], "11.2.1") == A100
    with pytest.raises(EngineMismatchError, match="NVIDIA L40S"):
        check_gpu_host(_manifest("same-cc"), [L40S], "11.2.1")
    with pytest.raises(
        EngineMismatchError, match=r"not installed; pip install tensorrt==11\.2\.1\.\*"
    ):
        check_gpu_host(m, [H100], None)
    with pytest.raises(EngineMismatchError, match=r"built with TensorRT 11\.2\.1 but 11\.1\.0"):
        check_gpu_host(m, [H100], "11.1.0")
    # plans load only on the TensorRT that built them: a patch release differs too
    patch = r"11\.2\.1 but 11\.2\.0 .*tensorrt==11\.2\.1\.\*"
    with pytest.raises(EngineMismatchError, match=patch):
        check_gpu_host(m, [H100], "11.2.0")


def test_loading_a_plan_on_this_host_refuses_before_touching_tensorrt(tmp_path):
    """In a fresh interpreter (so no earlier import can hide one): load_engine raises
    EngineMismatchError naming the GPU it needs, and neither tensorrt nor the plan was read."""
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "engine.plan").write_bytes(b"not a plan")
    write_manifest(_manifest(), engine)
    code = (
        "import sys\n"
        "from llmc.runtime.runners.engine_loader import load_engine\n"
        "from llmc.errors import EngineMismatchError\n"
        "try:\n"
        f"    load_engine({str(engine)!r})\n"
        "except EngineMismatchError as e:\n"
        "    print(str(e)); print('tensorrt' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    message, imported = out.stdout.strip().splitlines()
    assert "engine built for sm90 is a TensorRT plan" in message
    assert "needs a GPU of compute capability 9.0; this host has no CUDA GPU" in message
    assert "`llmc build /models/tiny --arch cpu`" in message
    assert imported == "False"


def test_manifest_records_tensorrt_and_reads_manifests_without_it(tmp_path):
    m = _manifest()
    write_manifest(m, tmp_path)
    assert read_manifest(tmp_path).tensorrt == m.tensorrt
    data = json.loads((tmp_path / "manifest.json").read_text())
    del data["tensorrt"]  # a manifest written before the field existed
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    assert read_manifest(tmp_path).tensorrt is None
    assert asdict(read_manifest(tmp_path)) == asdict(m) | {"tensorrt": None}


def test_kv_pool_of_a_plan_is_sized_by_the_cache_dtype_the_runner_allocates():
    import torch

    from llmc.engine.kv_cache import kv_cache_dtype_of
    from llmc.errors import EngineCorruptError
    from llmc.runtime.runners.engine_loader import kv_bytes_per_block, plan_num_blocks

    m = _manifest()  # a bfloat16 cache of 2 layers, blocks of 8, 1 KV head of 32
    elements = 2 * 2 * 8 * 1 * 32
    sizes = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1, "int8": 1}
    manifests = {d: replace(m, kv_cache_dtype=d) for d in sizes}
    assert {d: kv_bytes_per_block(mf) for d, mf in manifests.items()} == {
        d: elements * size for d, size in sizes.items()
    }
    # TrtRunner allocates its torch caches in this dtype.
    assert {d: getattr(torch, kv_cache_dtype_of(mf).name) for d, mf in manifests.items()} == {
        "bfloat16": torch.bfloat16,
        "float16": torch.float16,
        "float32": torch.float32,
        "fp8": torch.float8_e4m3fn,
        "int8": torch.int8,
    }
    assert plan_num_blocks(m, None, 20 * elements * 2) == 20
    with pytest.raises(EngineCorruptError, match="kv_cache_dtype 'fp16'"):
        kv_bytes_per_block(replace(m, kv_cache_dtype="fp16"))


def test_optimization_profile_covers_the_serving_limits():
    p = optimization_profile(
        num_kv_heads=2,
        head_dim=16,
        num_layers=2,
        block_size=16,
        max_num_tokens=512,
        max_batch=8,
        max_seq_len=1000,
    )
    # 1000 tokens need 63 blocks of 16; the default pool holds 8 such sequences: 504 blocks
    assert p["input_ids"] == p["positions"] == p["slot_mapping"]
    assert p["input_ids"] == ShapeRange((1,), (256,), (512,))
    assert p["logits_indices"] == p["seq_lens"] == ShapeRange((1,), (8,), (8,))
    assert p["query_start_loc"] == ShapeRange((2,), (9,), (9,))
    assert p["block_tables"] == ShapeRange((1, 1), (8, 63), (8, 63))
    assert (
        p["key_cache.1"]
        == p["value_cache.0"]
        == ShapeRange((1, 16, 2, 16), (504, 16, 2, 16), (504, 16, 2, 16))
    )
    assert len(p) == 7 + 4


def test_build_phases_drive_the_bar_and_cancel():
    ticks = []
    phases = BuildPhases(lambda done, total: ticks.append((done, total)))
    phases.start("Building engine", None, 3)
    phases.start("Tactic selection", "Building engine", 10)
    assert phases.step("Tactic selection", 0) is True
    assert phases.step("Building engine", 0) is True
    phases.finish("Tactic selection")
    phases.cancel()  # Ctrl-C
    assert phases.step("Building engine", 1) is False  # asks TensorRT to stop
    phases.finish("Building engine")
    assert ticks == [(0, 3), (1, 3), (2, 3)]  # nested phases do not move the bar
    assert phases.finished == ["Tactic selection", "Building engine"] and not phases.phases


def test_arch_capability():
    assert [arch_capability(a) for a in ("sm80", "sm86", "sm89", "sm90", "sm100", "sm120")] == [
        (8, 0),
        (8, 6),
        (8, 9),
        (9, 0),
        (10, 0),
        (12, 0),
    ]
    with pytest.raises(ValueError):
        arch_capability("cpu")


def test_ctrl_c_during_a_build_cancels_through_the_monitor():
    """A stand-in for build_serialized_network that, like TensorRT, calls step_complete from
    its own thread and returns None once asked to stop; a real SIGINT arrives meanwhile."""
    import os
    import signal
    import threading
    import time

    from llmc.compiler.backends.tensorrt.builder import _build_cancellable

    phases = BuildPhases()
    steps = []

    def build():
        phases.start("Building engine", None, 1000)
        for i in range(1000):
            time.sleep(0.01)
            steps.append(i)
            if not phases.step("Building engine", i):
                return None
        return b"plan"

    # Python's own SIGINT handler, as `llmc build` runs with: the test suite's other tests
    # (servers, runtimes) must not decide what Ctrl-C does here.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        assert _build_cancellable(build, phases) is None
    finally:
        signal.signal(signal.SIGINT, previous)
    assert phases.cancelled and 5 < len(steps) < 1000
    assert _build_cancellable(lambda: b"plan", BuildPhases()) == b"plan"
    with pytest.raises(ValueError, match="parser"):
        _build_cancellable(lambda: (_ for _ in ()).throw(ValueError("parser")), BuildPhases())


def test_inspect_a_tensorrt_engine_reports_its_record(tmp_path, capsys):
    from llmc.cli import main

    m = _manifest()
    m.tensorrt |= {
        "compute_capability": "9.0",
        "lint": {"passed": False, "errors": 2, "warnings": 0},
    }
    write_manifest(m, tmp_path)
    assert main(["inspect", str(tmp_path)]) == 1  # the recorded lint failed
    out = capsys.readouterr().out
    assert "tensorrt-engine" in out and "compute_capability: 9.0" in out
    assert "TensorRT lint (recorded at build) FAILED: 2 errors, 0 warnings" in out
    assert main(["inspect", str(tmp_path / "nothing")]) == 2
    assert (
        "is not an engine directory, a portable stage or an .onnx file" in capsys.readouterr().err
    )
