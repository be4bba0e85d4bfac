"""The ``onnxruntime`` backend: ``--arch cpu`` engines run by ONNX Runtime on this host's ISA.

Lowering rewrites the graph for the CPU (FP8 and microscaling weights emulated, llmc's fused
kernels) and optimizes it into ONNX Runtime segments and one graph (``lower``); the report
measures the execution providers and the engine's accuracy on the one chosen (``report``); the
manifest records the ISA, the provider and both (``manifest``).
"""

from __future__ import annotations

from pathlib import Path

from llmc.compiler.backends.onnxruntime.fast_path import check_fast_path
from llmc.compiler.backends.onnxruntime.host import plan_cpu
from llmc.compiler.backends.onnxruntime.lower import lower_to_cpu
from llmc.compiler.backends.onnxruntime.manifest import write_cpu_manifest
from llmc.compiler.backends.onnxruntime.provider_choice import check_requested
from llmc.compiler.backends.onnxruntime.report import report_cpu
from llmc.compiler.backends.protocol import (
    BuildRecord,
    EngineReport,
    HostPlan,
    LoweredEngine,
)
from llmc.compiler.config.build_config import BuildConfig
from llmc.compiler.memory.plan import MemoryPlan
from llmc.compiler.quantize import pipeline as qp
from llmc.compiler.stages.progress import Stage
from llmc.compiler.stages.quantize import EngineGraph, Reference
from llmc.runtime.runners.openvino_runner import OPENVINO_LOAD_FACTOR


class OnnxRuntimeBackend:
    """``--arch cpu``: ONNX Runtime with its execution providers (``provider_choice``)."""

    name = "onnxruntime"
    supports_draft = True

    def accepts(self, arch: str) -> bool:
        """The cpu target only."""
        return arch == "cpu"

    def why(self, arch: str) -> str:
        """The cpu target's line."""
        return f"{arch}: backend {self.name} (this host's ISA, run by ONNX Runtime)"

    def plan_host(self, config: BuildConfig) -> HostPlan:
        """The ``CpuPlan`` of this host (``host.plan_cpu``); raises BuildConfigError for an
        execution provider or dtype this host cannot run."""
        check_requested(config.source.dtype, config.target.execution_provider)
        plan = plan_cpu(config)
        bf16 = plan.layout.precision == "bf16"
        return HostPlan(
            bound_pairs=plan.bound_pairs,
            measures_engine=True,
            engine_load_factor=OPENVINO_LOAD_FACTOR if bf16 else 1.0,
            share_tied=not config.quantization.quantizes,  # a quantized build quantizes it
            detail=plan,
        )

    def output_dir(self, config: BuildConfig, model_id: str, host: HostPlan) -> Path:
        """``config.output_dir``."""
        return config.output_dir(model_id)

    def lower(
        self,
        graph: EngineGraph,
        engine_dir: Path,
        config: BuildConfig,
        host: HostPlan,
        stage: Stage,
        memory: MemoryPlan,
    ) -> LoweredEngine:
        """Rewrite ``graph`` for the CPU (in place: e.g. FP8 weights as float32), optimize it
        into ``engine_dir`` in the plan's layout and check the fused kernels. Raises
        FastPathError when ONNX Runtime did not fuse every quantized MatMul."""
        plan, quant, report = host.detail, config.quantization.quant, graph.quant_report
        if report is not None:
            qp.rewrite_for_cpu(graph.proto, report.counts)
        with stage("lower to ONNX Runtime (cpu)") as tick:
            _, optimized_ops = lower_to_cpu(
                graph.proto,
                engine_dir,
                threads=config.target.threads,
                progress=tick,
                choice=plan.layout,
                session_config=qp.session_config(quant),
                external_data_dir=graph.weights_dir,
                block_int8=plan.block_int8,
                llmc_norms=plan.llmc_norms,
                attention_fpmath=plan.attention_fpmath,
            )
        if report is None:
            return LoweredEngine(engine_dir, optimized_ops)
        quantization = report.to_dict()
        quantization["fast_path"] = check_fast_path(quant, report.counts, optimized_ops)
        return LoweredEngine(engine_dir, optimized_ops, quantization)

    def report(
        self,
        engine: LoweredEngine,
        reference: Reference,
        config: BuildConfig,
        stage: Stage,
        memory_allowed: int,
    ) -> EngineReport:
        """The provider choice, then the accuracy on the chosen provider (``report_cpu``)."""
        return report_cpu(engine, reference, config, stage, memory_allowed)

    def write_manifest(self, record: BuildRecord, stage: Stage) -> None:
        """Tokenizer files and ``manifest.json`` (``write_cpu_manifest``)."""
        write_cpu_manifest(record, stage)

    def finish(self, out: Path, config: BuildConfig, host: HostPlan, stage: Stage) -> Path:
        """Nothing more: the engine directory is complete."""
        return out
