"""Lower an engine graph to the cpu target: ONNX Runtime segments optimized for this host
(``llmc.compiler.backends.onnxruntime.lower``), and the check that quantized layers reached their
fused kernels."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmc.compiler.backends.onnxruntime.host import CpuPlan
from llmc.compiler.backends.onnxruntime.lower import lower_to_cpu
from llmc.compiler.config.build_config import BuildConfig
from llmc.compiler.quantize import pipeline as qp
from llmc.compiler.stages.progress import Stage, no_stage
from llmc.compiler.stages.quantize import EngineGraph


@dataclass(frozen=True)
class LoweredEngine:
    """A cpu engine's graph written into ``engine_dir``: ``optimized_ops`` counts the ops of
    the optimized segments; ``quantization`` is the quantization report with its fast-path
    check ({op: {"expected", "found"}} under "fast_path"), None for an unquantized engine."""

    engine_dir: Path
    optimized_ops: dict[str, int]
    quantization: dict | None = None


def lower_cpu(
    graph: EngineGraph,
    engine_dir: Path,
    config: BuildConfig,
    plan: CpuPlan,
    stage: Stage = no_stage,
) -> LoweredEngine:
    """Rewrite ``graph`` for the CPU (in place: e.g. FP8 weights as float32), optimize it into
    ``engine_dir`` in ``plan.layout``'s form and check the fused kernels. Raises FastPathError
    when ONNX Runtime did not fuse every quantized MatMul."""
    quant = config.quantization.quant
    report = graph.quant_report
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
    quantization["fast_path"] = qp.check_fast_path(quant, report.counts, optimized_ops)
    return LoweredEngine(engine_dir, optimized_ops, quantization)
