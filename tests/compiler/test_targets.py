"""The target registry: what each target says, the host check dispatching through it (a dummy
target in a scratch registry), and the registry's entries against what real builds write."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from llmc.compiler.quantize.formats import FORMATS
from llmc.engine.gpu import GpuInfo, arch_capability, capability_name
from llmc.engine.host import check_runs_here
from llmc.engine.manifest import EngineManifest, read_manifest
from llmc.engine.provider import PROVIDERS
from llmc.engine.targets import (
    TARGETS,
    Target,
    UnknownTargetError,
    registry,
    target,
    target_names,
)
from llmc.engine.targets import sm as sm_module
from llmc.engine.targets.cpu import CPU
from llmc.engine.targets.sm import SM_TABLE, SmTarget
from llmc.errors import EngineCorruptError, EngineMismatchError, LlmcError
from llmc.plugins.paged_attention import trt_aot
from llmc.quant.protocol import sm_of
from tests.manifests import make_manifest

GPU_ARCHS = ("sm80", "sm86", "sm89", "sm90", "sm100", "sm120")


@dataclass(frozen=True)
class DummyTarget:
    """A target as a new module would add it: records the manifests it was asked to check and
    refuses those built with quant "refused"."""

    name: str = "dummy"
    backend: str = "dummy-backend"
    dtypes: tuple[str, ...] = ("float32",)
    default_dtype: str = "float32"
    execution_providers: tuple[str, ...] = ()
    capability: tuple[int, int] | None = None
    checked: list[EngineManifest] = field(default_factory=list, compare=False)

    def check_runs_here(self, manifest: EngineManifest) -> None:
        self.checked.append(manifest)
        if manifest.quant == "refused":
            raise EngineMismatchError("the dummy backend refuses it")

    def missing_for_build(self) -> list[str]:
        return []


def test_registry_holds_cpu_then_each_gpu_arch():
    assert tuple(TARGETS) == ("cpu", *GPU_ARCHS)
    assert target_names("onnxruntime") == ("cpu",)
    assert target_names("tensorrt", "tensorrt-rtx") == GPU_ARCHS
    # TensorRT for RTX builds the architectures it targets; TensorRT 11 the data-center ones.
    assert target_names("tensorrt-rtx") == ("sm86", "sm89", "sm120")
    assert target_names("tensorrt") == ("sm80", "sm90", "sm100")
    assert all(isinstance(t, Target) and TARGETS[name] is t for name, t in TARGETS.items())
    assert target("cpu") is CPU
    assert (CPU.backend, CPU.dtypes, CPU.default_dtype) == (
        "onnxruntime",
        ("float32", "bfloat16"),
        "float32",
    )
    assert CPU.execution_providers == (
        "cpu",
        "openvino",
        "openvino-runtime",
        "cpu+openvino-runtime",
    )
    assert CPU.capability is None
    for name in GPU_ARCHS:
        t = target(name)
        assert (t.backend, t.dtypes, t.default_dtype) == (
            "tensorrt-rtx" if name in ("sm86", "sm89", "sm120") else "tensorrt",
            ("bfloat16", "float16", "float32"),
            "bfloat16",
        )
        assert t.execution_providers == ()


def test_unknown_target_names_the_known_ones():
    with pytest.raises(UnknownTargetError, match="unknown target 'sm75'; known targets: cpu, sm80"):
        target("sm75")
    with pytest.raises(ValueError, match="sm120"):  # a ValueError too
        sm_of("sm75")


def test_registry_refuses_two_targets_of_one_name_and_a_foreign_default_dtype():
    with pytest.raises(ValueError, match="two targets are named 'cpu'"):
        registry(CPU, CPU)
    with pytest.raises(ValueError, match="default dtype float16"):
        registry(DummyTarget(default_dtype="float16"))


def test_sm_table_rows():
    """One row per arch: its capability is the one its name spells, FP8 from sm89 as the fp8
    format's rule says, FP4 from sm100 (DESIGN §5), and the AOT kernel knows the arch."""
    assert [row[0] for row in SM_TABLE] == list(GPU_ARCHS)
    for t in (target(name) for name in GPU_ARCHS):
        assert isinstance(t, SmTarget)
        assert t.capability == arch_capability(t.name)
        assert t.capability_name == capability_name(t.name)
        assert t.sm == sm_of(t.name) == int(t.name[2:])
        assert t.fp8 == FORMATS["fp8"].runs_on(t.name) == (t.sm >= 89)
        assert t.fp4 == (t.sm >= 100)
        assert t.sm in trt_aot.MAX_SHARED_MEMORY and t.sm in trt_aot.MIN_PTX_ISA
    assert sm_of("cpu") is None and FORMATS["fp8"].runs_on("cpu")  # FP8 emulated on the CPU


def test_host_check_dispatches_to_a_registered_target():
    """Adding a target is one registry entry: ``check_runs_here`` reaches a dummy target's own
    check through a scratch registry; the global registry does not know it."""
    dummy = DummyTarget()
    scratch = registry(*TARGETS.values(), dummy)
    m = make_manifest("dummy", "dummy-backend")
    check_runs_here(m, scratch)
    assert dummy.checked == [m]
    with pytest.raises(EngineMismatchError, match="the dummy backend refuses it"):
        check_runs_here(replace(m, quant="refused"), scratch)
    assert len(dummy.checked) == 2
    assert "dummy" not in TARGETS
    with pytest.raises(EngineMismatchError) as e:
        check_runs_here(m)
    assert "target 'dummy', which this llmc does not know (known: cpu, sm80" in str(e.value)
    assert "`llmc build /models/tiny --arch ...`" in str(e.value)
    with pytest.raises(EngineCorruptError, match="says target dummy but backend 'tensorrt'"):
        check_runs_here(replace(m, backend="tensorrt"), scratch)
    assert len(dummy.checked) == 3


def test_sm_engine_is_checked_against_the_gpus_and_tensorrt(monkeypatch):
    m = make_manifest(
        "sm90",
        "tensorrt",
        backend_version="11.2.1",
        dtype="bfloat16",
        execution_provider="TensorRT",
        tensorrt={"version": "11.2.1", "plan": "engine.plan", "hardware_compatibility": "none"},
    )
    monkeypatch.setattr(sm_module, "detect_gpus", lambda: [])
    with pytest.raises(EngineMismatchError, match="compute capability 9.0; this host has no CUDA"):
        check_runs_here(m)
    monkeypatch.setattr(sm_module, "detect_gpus", lambda: [GpuInfo(0, "NVIDIA H100", (9, 0))])
    monkeypatch.setattr(sm_module, "tensorrt_version", lambda: "11.2.1.5")
    check_runs_here(m)
    with pytest.raises(EngineMismatchError, match="NVIDIA H100 \\(sm90\\); rebuild with"):
        check_runs_here(replace(m, target="sm89"))


def test_cpu_engine_built_here_agrees_with_the_cpu_target(tiny_llama_engine: Path):
    """A real cpu build's manifest: the cpu target, its backend, its default dtype, one of its
    execution providers; the registry's host check accepts it on the host that built it."""
    m = read_manifest(tiny_llama_engine)
    assert m.target == CPU.name and m.backend == CPU.backend
    assert m.dtype == CPU.default_dtype
    assert m.execution_provider in [PROVIDERS[p] for p in CPU.execution_providers]
    assert CPU.missing_for_build() == []
    check_runs_here(m)
    with pytest.raises(EngineMismatchError, match="onnxruntime 0.1.0 but"):
        check_runs_here(replace(m, backend_version="0.1.0"))


def test_gpu_build_agrees_with_its_sm_target(tiny_llama_dir: Path, tmp_path: Path):
    """A real sm90 build: without TensorRT or an sm90 GPU it writes the portable stage and
    names what ``missing_for_build`` says; its target and dtype are the sm90 target's."""
    from llmc.compiler.build import build
    from llmc.compiler.config.build_config import BuildConfig
    from llmc.engine import stage as st

    sm90 = target("sm90")
    out = tmp_path / "sm90"
    options = {"model": str(tiny_llama_dir), "arch": "sm90", "block_size": 8, "max_seq_len": 64}
    config = BuildConfig.from_sources(None, options | {"output": str(out)})
    missing = sm90.missing_for_build()
    if not missing:  # a GPU builder: the plan is built
        m = read_manifest(build(config).engine_dir)
        assert (m.target, m.backend, m.dtype) == ("sm90", sm90.backend, sm90.default_dtype)
        assert m.tensorrt["compute_capability"] == sm90.capability_name
        check_runs_here(m)
        return
    with pytest.raises(LlmcError) as e:
        build(config)
    assert all(phrase in str(e.value) for phrase in missing)
    stage = st.read_stage(out)
    assert (stage.target, stage.dtype, stage.kv_cache_dtype) == ("sm90", "bfloat16", "bfloat16")
    assert sm90.default_dtype == stage.dtype and stage.lint["target"] == "sm90"
