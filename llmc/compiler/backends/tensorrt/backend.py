"""The ``tensorrt`` backend: ``--arch sm*`` engines, a TensorRT plan built from a portable stage.

Lowering writes the portable stage (``llmc.engine.stage``): the engine graph lowered to what
TensorRT's parser takes (``lower``), linted for the target, with the tokenizer and the
calibration statistics. A streamed build's graph is lowered without reading its weights
(``lower_streamed``) and the stage's weights are computed and written one tensor at a time by
``onnx_ir.save``; the lint then reads the written stage, as ``llmc build --from`` does. A graph
held in memory (GGUF architectures converted whole) is lowered and linted in memory. Both write
the same stage, bit for bit (``tests/compiler/test_trt_stage_streamed.py``).

``finish`` builds the plan with the target's builder (``flavour``: TensorRT for RTX for sm86,
sm89 and sm120 on any host with its libraries; TensorRT 11 for the rest, where this host has it
and a GPU of the target); elsewhere the build stops after the stage with
``TensorRTUnavailableError``. Nothing is
measured on the stage: accuracy is an engine's, and the plan is built where it runs.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import onnx
import onnx_ir as ir

from llmc.calibration.stats_cache import StatsCache, save_stats
from llmc.compiler.backends.protocol import (
    BuildRecord,
    EngineReport,
    HostPlan,
    LoweredEngine,
)
from llmc.compiler.backends.tensorrt import lint
from llmc.compiler.backends.tensorrt.builder import check_hardware_compat
from llmc.compiler.backends.tensorrt.engine_dir import write_engine
from llmc.compiler.backends.tensorrt.finish import unavailable
from llmc.compiler.backends.tensorrt.flavour import TENSORRT, PlanFlavour
from llmc.compiler.backends.tensorrt.lower import lower_for_tensorrt, lower_streamed
from llmc.compiler.config.build_config import BuildConfig
from llmc.compiler.config.calibration import CalibrationOptions
from llmc.compiler.config.destination import DestinationOptions
from llmc.compiler.memory.plan import MemoryPlan
from llmc.compiler.quantize.qdq import QuantReport
from llmc.compiler.stages.manifest import core_facts
from llmc.compiler.stages.progress import Stage
from llmc.compiler.stages.quantize import EngineGraph, Reference
from llmc.compiler.stages.tokenizer import write_tokenizer_files
from llmc.engine import stage as st
from llmc.engine.targets import TARGETS


@dataclass(frozen=True)
class StageLowering:
    """The TensorRT half of a lowered stage: the lint report and, for a graph lowered in
    memory, the lowered proto (``write_stage`` writes it with its weights)."""

    lint: lint.LintReport
    proto: onnx.ModelProto | None = None


class TensorRTBackend:
    """``--arch sm*`` of TensorRT 11 (sm80, sm90, sm100): the portable stage here, the plan on
    a GPU builder."""

    name = "tensorrt"
    supports_draft = False
    flavour: PlanFlavour = TENSORRT

    def accepts(self, arch: str) -> bool:
        """The ``sm*`` targets whose backend (``llmc.engine.targets``) is this one."""
        known = TARGETS.get(arch)
        return known is not None and known.backend == self.name

    def why(self, arch: str) -> str:
        """Why ``arch`` is built by this backend (the CLI says it)."""
        return f"{arch}: backend {self.name} ({self.flavour.why})"

    def plan_host(self, config: BuildConfig) -> HostPlan:
        """Refuse a hardware-compatibility level the plugin's kernel cannot honour (before the
        slow part, not after it); ``detail``: what this host lacks to build the plan."""
        check_hardware_compat(config.target.hardware_compat)
        return HostPlan(detail=self.flavour.missing(config.target.arch))

    def output_dir(self, config: BuildConfig, model_id: str, host: HostPlan) -> Path:
        """The stage directory: beside the engine (``.stage``) when this host finishes it,
        else ``-o`` (or the default engine directory + ``-stage``)."""
        out = config.output_dir(model_id)
        final = not host.detail
        if final or config.destination.output is None:
            out = out.with_name(out.name + (".stage" if final else "-stage"))
        return out

    def lower(
        self,
        graph: EngineGraph,
        engine_dir: Path,
        config: BuildConfig,
        host: HostPlan,
        stage: Stage,
        memory: MemoryPlan,
    ) -> LoweredEngine:
        """Lower ``graph`` to what TensorRT's parser takes in the build's dtype and KV cache
        dtype and lint it for the target (raises TensorRTLintError on errors); a streamed
        graph's weights are written into ``engine_dir`` as they are lowered."""
        dtype, arch = config.source.dtype, config.target.arch
        quantization = graph.quant_report.to_dict() if graph.quant_report is not None else None
        if graph.weights_dir is None:
            with stage(f"lower to TensorRT ({dtype})"):
                lower_for_tensorrt(graph.proto, dtype, config.kv_cache_dtype)
            with stage("TensorRT lint"):
                report = lint.lint_model(graph.proto, arch)
                lint.raise_on_errors(report, "the lowered engine graph")
            lowering = StageLowering(report, graph.proto)
            return LoweredEngine(engine_dir, report.op_counts, quantization, lowering)
        with stage(f"lower to TensorRT ({dtype})"):
            lowered = lower_streamed(graph.proto, graph.weights_dir, dtype, config.kv_cache_dtype)
        path = engine_dir / st.MODEL_FILE
        with stage("write the stage's weights"):
            external = st.MODEL_FILE + ".data"
            in_flight = memory.in_flight_bytes
            ir.save(lowered, path, external_data=external, max_in_flight_bytes=in_flight)
            del lowered
        with stage("TensorRT lint"):
            report = lint.lint_file(path, arch)
            lint.raise_on_errors(report, "the lowered engine graph")
        return LoweredEngine(engine_dir, report.op_counts, quantization, StageLowering(report))

    def report(
        self,
        engine: LoweredEngine,
        reference: Reference,
        config: BuildConfig,
        stage: Stage,
        memory_allowed: int,
    ) -> EngineReport:
        """Nothing is measured on a stage (no TensorRT runtime here)."""
        return EngineReport(None)

    def write_manifest(self, record: BuildRecord, stage: Stage) -> None:
        """The stage's manifest, tokenizer files and calibration statistics (``write_stage``
        records every file's digest). A graph lowered in memory is written with it; a streamed
        one's weights are in place and its graph is saved again, nothing rewritten."""
        config, model, lowering = record.config, record.model, record.engine.detail
        stage_dir = record.engine.engine_dir
        with stage("portable stage"):
            tokenizer_digest = write_tokenizer_files(model.tokenizer, model.generation, stage_dir)
            report = record.graph.quant_report
            manifest = st.StageManifest(
                # The engine's destination is chosen when the stage is finished.
                **core_facts(
                    replace(config, destination=DestinationOptions()),
                    model,
                    record.graph,
                    tokenizer_digest,
                    report.to_dict() if report is not None else None,
                ),
                calibration_stats=_copy_calibration_stats(report, config.calibration, stage_dir),
                lint=lowering.lint.to_dict(),
            )
            proto = lowering.proto
            if proto is None:
                proto = onnx.load(str(stage_dir / st.MODEL_FILE), load_external_data=False)
            st.write_stage(proto, manifest, stage_dir)

    def finish(self, out: Path, config: BuildConfig, host: HostPlan, stage: Stage) -> Path:
        """Build the plan from the stage at ``out`` into the engine directory and remove the
        stage; raises TensorRTUnavailableError (the stage kept) where this host cannot."""
        if host.detail:
            raise unavailable(out, config.target.arch, host.detail)
        m = st.read_stage(out)
        with stage("TensorRT lint"):
            report = lint.lint_file(out / st.MODEL_FILE, m.target)
            lint.raise_on_errors(report, f"stage {out}")
        engine_dir = write_engine(out, m, config, report, stage)
        shutil.rmtree(out, ignore_errors=True)
        return engine_dir


def _copy_calibration_stats(
    report: QuantReport | None, calibration: CalibrationOptions, stage_dir: Path
) -> str | None:
    """Copy the cached calibration statistics a quantized graph was built with into the stage;
    returns their path in it, or None (unquantized, or no longer cached)."""
    if report is None:
        return None
    cache = StatsCache(calibration.stats_path(report.spec["calibration"]["cache_key"]))
    # Without the Gram matrices (~0.5 GB for Gemma 3 270M): GPTQ used them, and its rounded
    # weights are in the graph already.
    cached = cache.load_all(gram=False)
    if cached is None:
        return None
    save_stats(cached, stage_dir / st.CALIBRATION_FILE)
    return st.CALIBRATION_FILE
