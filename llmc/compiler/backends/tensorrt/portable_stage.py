"""The portable stage of a GPU build (``llmc.engine.stage``): checkpoint -> export, passes,
calibration and Q/DQ (the stages the CPU build runs) -> the TensorRT lowering and lint -> the
stage directory.

Two paths, as the CPU build's (``llmc.compiler.memory.plan``):

- **streamed** (a checkpoint ``streaming_export.can_stream`` reads one tensor at a time): the
  model is never loaded. The float graph and its Q/DQ rewrite are written into a scratch
  directory beside the stage with their weights as external data (``stages.export``,
  ``stages.quantize``), lowered without reading them (``lower.lower_streamed``), and the
  stage's weights are computed (casts to the compute dtype, the formats' weight rewrites) and
  written one tensor at a time by ``onnx_ir.save``; the lint then reads the written stage, as
  ``llmc build --from`` does.
- **in memory** (other GGUF files): the float32 model is loaded, exported, quantized and lowered
  in memory (``lower.lower_for_tensorrt``).

Both write the same stage: the same graph and the same weights, bit for bit
(``tests/test_trt_stage_streamed.py``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import onnx
import onnx_ir as ir

from llmc.calibration.stats_cache import StatsCache, save_stats
from llmc.compiler.backends.tensorrt import lint
from llmc.compiler.backends.tensorrt.lower import lower_for_tensorrt, lower_streamed
from llmc.compiler.config.build_config import BuildConfig
from llmc.compiler.config.calibration import CalibrationOptions
from llmc.compiler.config.destination import DestinationOptions
from llmc.compiler.memory.plan import MemoryPlan, plan_memory
from llmc.compiler.quantize.qdq import QuantReport
from llmc.compiler.stages.export import export
from llmc.compiler.stages.load import LoadedModel, ResolvedModel, load, resolve
from llmc.compiler.stages.manifest import core_facts
from llmc.compiler.stages.progress import Stage, stage_of
from llmc.compiler.stages.quantize import (
    CalibrationTexts,
    EngineGraph,
    quantize,
    read_texts,
    sampling_model,
)
from llmc.compiler.stages.tokenizer import write_tokenizer_files
from llmc.engine import stage as st
from llmc.engine.staged_dir import scratch_dir, staged_dir


def prepare_stage(config: BuildConfig, progress, final: bool) -> Path:
    """Write ``config``'s portable stage (a GPU target); returns the stage directory: ``-o``
    (else the default engine directory + ``-stage``) when the build stops there (``final``
    False), else beside the engine (``.stage``). ``progress``: a ``BuildProgress`` or None.
    Raises what the stages raise (ModelSourceError, CalibrationDataError, BuildConfigError for
    a build over ``--max-build-memory``) and TensorRTLintError."""

    stage = stage_of(progress)
    resolved = resolve(config.source, stage)
    config = config.for_model(resolved.source.dims)  # --max-seq-len within the model's positions
    texts = read_texts(config)  # bad files fail before work
    memory = _memory_plan(resolved, config, texts)  # refuses what cannot fit, at once
    out = config.output_dir(resolved.model_id)
    if final or config.destination.output is None:
        out = out.with_name(out.name + (".stage" if final else "-stage"))
    if memory.streamed:
        _streamed_stage(config, resolved, texts, memory, out, stage)
        return out
    model = load(resolved, stage)  # calibration runs the float32 graph on the CPU
    graph = quantize(export(model, config.export, stage), model, config, texts, stage)
    lint_report = lower_tensorrt(graph, config, stage)
    with staged_dir(out) as tmp:
        with stage("portable stage"):
            manifest = _stage_manifest(config, model, graph, lint_report, tmp)
            del model
            st.write_stage(graph.proto, manifest, tmp)
    return out


def _memory_plan(
    resolved: ResolvedModel, config: BuildConfig, texts: CalibrationTexts | None
) -> MemoryPlan:
    """``plan_memory`` of this GPU build (raises BuildConfigError when it cannot fit
    ``--max-build-memory``), streamed when the checkpoint can stream."""
    calib = config.calibration
    return plan_memory(
        resolved.source,
        config.quantization.quant,
        cpu=False,
        limit_gb=config.target.max_build_memory,
        spec=config.quant_spec() if config.quantization.quantizes else None,
        calib_tokens=calib.calib_samples * calib.calib_seq_len,
        samples_text=texts is not None and not texts.calibration.path,
    )


def _streamed_stage(
    config: BuildConfig,
    resolved: ResolvedModel,
    texts: CalibrationTexts | None,
    memory: MemoryPlan,
    out: Path,
    stage: Stage,
) -> None:
    """Write the portable stage to ``out`` without loading the model (as the CPU build
    streams): the float graph and its Q/DQ rewrite are written into a scratch directory beside
    ``out`` with their weights read one tensor at a time, lowered without reading them
    (``lower_streamed``), and the stage's weights are computed and written one at a time; the
    lint then reads the written stage (small tensors only, as ``finish_stage`` does)."""
    dtype = config.source.dtype
    with scratch_dir(out) as work:
        model = load(resolved, stage, memory)
        reference = export(model, config.export, stage, work, memory.in_flight_bytes)
        sampler = sampling_model(model, reference, texts, config)
        graph = quantize(reference, model, config, texts, stage, work_dir=work, sampler=sampler)
        with stage(f"lower to TensorRT ({dtype})"):
            lowered = lower_streamed(graph.proto, graph.weights_dir, dtype, config.kv_cache_dtype)
        with staged_dir(out) as tmp:
            path = tmp / st.MODEL_FILE
            with stage("write the stage's weights"):
                external = st.MODEL_FILE + ".data"
                in_flight = memory.in_flight_bytes
                ir.save(lowered, path, external_data=external, max_in_flight_bytes=in_flight)
                del lowered
            with stage("TensorRT lint"):
                lint_report = lint.lint_file(path, config.target.arch)
                lint.raise_on_errors(lint_report, "the lowered engine graph")
            with stage("portable stage"):
                manifest = _stage_manifest(config, model, graph, lint_report, tmp)
                # Its weights are in place: write_stage saves the graph again (its tensors
                # already external, nothing is rewritten) and records every file's digest.
                st.write_stage(onnx.load(str(path), load_external_data=False), manifest, tmp)


def _stage_manifest(
    config: BuildConfig,
    model: LoadedModel,
    graph: EngineGraph,
    lint_report: lint.LintReport,
    stage_dir: Path,
) -> st.StageManifest:
    """Write the tokenizer files and the calibration statistics into ``stage_dir`` and return
    the stage's manifest (its ``files`` are recorded by ``write_stage``)."""
    tokenizer_digest = write_tokenizer_files(model.tokenizer, model.generation, stage_dir)
    report = graph.quant_report
    return st.StageManifest(
        # The engine's destination is chosen when the stage is finished.
        **core_facts(
            replace(config, destination=DestinationOptions()),
            model,
            graph,
            tokenizer_digest,
            report.to_dict() if report is not None else None,
        ),
        calibration_stats=_copy_calibration_stats(report, config.calibration, stage_dir),
        lint=lint_report.to_dict(),
    )


def lower_tensorrt(graph: EngineGraph, config: BuildConfig, stage: Stage) -> lint.LintReport:
    """Lower ``graph`` in place to what TensorRT's parser takes in ``config``'s dtype and KV
    cache dtype (``lower_for_tensorrt``) and lint it for the target. Returns the lint report;
    raises TensorRTLintError when it finds errors."""
    dtype = config.source.dtype
    with stage(f"lower to TensorRT ({dtype})"):
        lower_for_tensorrt(graph.proto, dtype, config.kv_cache_dtype)
    with stage("TensorRT lint"):
        report = lint.lint_model(graph.proto, config.target.arch)
        lint.raise_on_errors(report, "the lowered engine graph")
    return report


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
