"""Quantize the float graph as ``--quant`` says: calibrate (cached), then write Q/DQ nodes
(``llmc.compiler.quantize.pipeline``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from llmc.compiler.config.build_config import BuildConfig
from llmc.compiler.quantize import pipeline as qp
from llmc.compiler.quantize.qdq import QuantReport
from llmc.compiler.quantize.texts import TextSource, text_sources
from llmc.compiler.stages.export import FloatGraph
from llmc.compiler.stages.load import LoadedModel
from llmc.compiler.stages.progress import Stage, no_stage


@dataclass(frozen=True)
class CalibrationTexts:
    """Where a quantized build's text comes from: calibration, and the held-out text of the
    accuracy report (never overlapping, ``texts.text_sources``)."""

    calibration: TextSource
    heldout: TextSource


@dataclass(frozen=True)
class Reference:
    """What the quantize stage calibrates and a lowered engine is measured against: the loaded
    ``model``, its float ``graph``, the build's ``texts`` (None: nothing is calibrated or
    measured for accuracy) and the ``sampler`` that writes text where no file gives it
    (``text_sampler.sampling_model``; None: the loaded model)."""

    model: LoadedModel
    graph: FloatGraph
    texts: CalibrationTexts | None
    sampler: Any = None


@dataclass(frozen=True)
class EngineGraph:
    """The graph a target lowers: the float graph, or its Q/DQ rewrite with the report of what
    was quantized how (``quant_report``; None for ``--quant none``)."""

    proto: onnx.ModelProto
    pass_report: dict[str, int]
    quant_report: QuantReport | None = None
    weights_dir: Path | None = None  # as FloatGraph.weights_dir


def read_texts(config: BuildConfig) -> CalibrationTexts | None:
    """The text sources of a build whose engine gets an accuracy report: a quantized one, or a
    cpu ``--dtype bfloat16`` one (bf16 compute; None otherwise). The files are read now so that
    an empty or unreadable one fails before any work (CalibrationDataError)."""
    bf16_cpu = config.target.is_cpu and config.source.dtype == "bfloat16"
    if not (config.quantization.quantizes or bf16_cpu):
        return None
    return CalibrationTexts(*text_sources(config.calibration))


def quantize(
    reference: Reference,
    config: BuildConfig,
    stage: Stage = no_stage,
    bound_pairs: bool = False,
    work_dir: Path | None = None,
    resume=None,
) -> EngineGraph:
    """``reference.graph`` with Q/DQ nodes as ``config`` says (the graph itself for ``--quant
    none``), calibrated on ``reference.texts`` (``read_texts``), text sampled by its sampler
    (default: the loaded model). ``bound_pairs``: int8 weight pairs within 128 (cpu hosts
    without VNNI, ``host.int8_bound_pairs``). A streamed graph is quantized into ``work_dir``.
    ``resume`` (a ``path_search.Resume``) resumes the ``--accuracy-target`` search past an
    engine that missed the target."""
    graph, model, texts = reference.graph, reference.model, reference.texts
    if not config.quantization.quantizes:
        return EngineGraph(graph.proto, graph.pass_report, weights_dir=graph.weights_dir)
    if texts is None:
        raise ValueError("a quantized build needs its calibration texts (read_texts)")
    resolved = model.resolved
    proto, report = qp.quantize(
        config,
        graph.proto,
        model.hf_model if reference.sampler is None else reference.sampler,
        resolved.tokenizer,
        resolved.checkpoint_digest,
        texts.calibration,
        stage,
        bound_pairs=bound_pairs,
        weights_dir=graph.weights_dir,
        work_dir=work_dir,
        heldout_source=texts.heldout,
        gguf_types=_gguf_types(resolved.source),
        resume=resume,
    )
    return EngineGraph(proto, graph.pass_report, report, work_dir if graph.weights_dir else None)


def _gguf_types(source):
    """The stored types of a GGUF checkpoint (``anchors.SourceTypes``), None for others."""
    if not source.gguf_file:
        return None
    from llmc.compiler.quantize.anchors import gguf_source_types

    return gguf_source_types(source.directory / source.gguf_file)
