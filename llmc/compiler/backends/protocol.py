"""What every backend of ``llmc build`` implements (``registry.BACKENDS``).

``llmc.compiler.build.build`` drives any backend through the same typed stages: resolve ->
load -> export -> passes -> quantize (the target-independent half, ``llmc.compiler.stages``),
then the backend's own: ``plan_host`` (what its host needs, checked before any weight is read),
``lower`` (the engine graph into the engine directory), ``report`` (what it measures on the
lowered engine: accuracy, provider), ``write_manifest`` (what its manifest records) and
``finish`` (what comes after the directory is in place: a TensorRT plan build).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from llmc.calibration.accuracy import AccuracyReport
    from llmc.compiler.config.build_config import BuildConfig
    from llmc.compiler.memory.plan import MemoryPlan
    from llmc.compiler.stages.build_stats import BuildStats
    from llmc.compiler.stages.load import LoadedModel
    from llmc.compiler.stages.progress import Stage
    from llmc.compiler.stages.quantize import EngineGraph, Reference


@dataclass(frozen=True)
class HostPlan:
    """What a backend needs of this host, decided before any weight is read.

    ``bound_pairs``: int8 weight pairs within 128 (quantization, cpu hosts without VNNI);
    ``measures_engine``: the build loads the engine it wrote to measure it (the memory plan
    counts it) at ``engine_load_factor`` times its bytes; ``share_tied``: export stores a tied
    embedding table once (``tied_weights`` pass); ``detail``: the backend's own plan (the cpu
    ``CpuPlan``, the TensorRT tools missing here)."""

    bound_pairs: bool = False
    measures_engine: bool = False
    engine_load_factor: float = 1.0
    share_tied: bool = False
    detail: Any = None


@dataclass(frozen=True)
class LoweredEngine:
    """An engine graph written into ``engine_dir``: ``optimized_ops`` counts its ops as the
    backend lowered them; ``quantization`` is the quantization report as the manifest records
    it (None: unquantized); ``detail`` the backend's own record (TensorRT: the lint report)."""

    engine_dir: Path
    optimized_ops: dict[str, int]
    quantization: dict | None = None
    detail: Any = None


@dataclass(frozen=True)
class EngineReport:
    """What a backend measured on a lowered engine: ``accuracy`` against the float graph on
    held-out text (None when not measured) and its own ``detail`` (cpu: the provider
    selection)."""

    accuracy: AccuracyReport | None
    detail: Any = None


@dataclass(frozen=True)
class BuildRecord:
    """Everything a backend's manifest may record of a build: the config, the loaded model,
    the engine graph, the lowered engine and its report, the host plan, the stages measured so
    far and the memory plan."""

    config: BuildConfig
    model: LoadedModel
    graph: EngineGraph
    engine: LoweredEngine
    report: EngineReport
    host: HostPlan
    stats: BuildStats | None = None
    memory: MemoryPlan | None = None


class Backend(Protocol):
    """One way to turn an engine graph into an engine for a family of targets."""

    #: The manifest's ``backend`` and the registry key.
    name: str
    #: Whether ``--draft`` (a speculative-decoding draft engine inside this one) is built.
    supports_draft: bool

    def accepts(self, arch: str) -> bool:
        """Whether this backend builds ``--arch`` ``arch`` ("cpu", "sm89", ...)."""
        ...

    def why(self, arch: str) -> str:
        """One line: which backend builds ``arch`` and why (the CLI prints it)."""
        ...

    def plan_host(self, config: BuildConfig) -> HostPlan:
        """What this host needs for ``config``; raises BuildConfigError (or the backend's own
        error) for a build it cannot make, before any weight is read."""
        ...

    def output_dir(self, config: BuildConfig, model_id: str, host: HostPlan) -> Path:
        """The directory the build writes (``config.output_dir`` or the backend's variant)."""
        ...

    def lower(
        self,
        graph: EngineGraph,
        engine_dir: Path,
        config: BuildConfig,
        host: HostPlan,
        stage: Stage,
        memory: MemoryPlan,
    ) -> LoweredEngine:
        """Write ``graph`` lowered for the target into ``engine_dir`` (a staged directory)."""
        ...

    def report(
        self,
        engine: LoweredEngine,
        reference: Reference,
        config: BuildConfig,
        stage: Stage,
        memory_allowed: int,
    ) -> EngineReport:
        """Measure ``engine`` against ``reference``; ``memory_allowed``: bytes the measurement
        may add without raising the build's peak RSS."""
        ...

    def write_manifest(self, record: BuildRecord, stage: Stage) -> None:
        """Write the manifest (the last file of ``record.engine.engine_dir``)."""
        ...

    def finish(self, out: Path, config: BuildConfig, host: HostPlan, stage: Stage) -> Path:
        """What follows once ``out`` is in place; returns the engine directory to publish."""
        ...
